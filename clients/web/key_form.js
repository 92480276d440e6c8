// The header's key field, shown only when the server answers 401 (it has API keys).

import { keyProblem, setApiKey } from "./api_key.js";
import { $, showError } from "./dom.js";

/**
 * Show the key field with `message` (an earlier refusal, or null) and resolve once the
 * person submits a key that can be sent (api_key.js keyProblem); the key is then held
 * for this tab and the field hidden. `onError(text)` hears every message shown.
 */
export function askForKey(message, onError = () => {}) {
  const form = $("key-form");
  const input = $("key-input");
  const error = $("key-error");
  const show = (text) => {
    showError(error, text);
    onError(text);
  };
  show(message);
  form.hidden = false;
  input.focus();
  return new Promise((resolve) => {
    const submit = (e) => {
      e.preventDefault();
      // Keys hold no whitespace (the server refuses such keys), so a pasted newline or
      // space around one is not part of it.
      const key = input.value.trim();
      const problem = keyProblem(key);
      if (problem) {
        show(problem);
        return;
      }
      form.removeEventListener("submit", submit);
      input.value = "";
      showError(error, "");
      form.hidden = true;
      setApiKey(key);
      resolve(key);
    };
    form.addEventListener("submit", submit);
  });
}
