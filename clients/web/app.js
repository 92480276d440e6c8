// The demo page: fetch the model list, start the three panels, expose test hooks.
//
// window.demo (read by tests/e2e/test_web.py):
//   ready           true once every panel has started (bootError set instead on failure)
//   loading         the progress lines shown while the server loaded its models, in order
//   models          GET /v1/models data (once no model is loading)
//   world           WorldPanel.state   (chunkIndex, framesDrawn, appliedEventIds, lastError, connected, usesPrompts,
//                                       retries, retryStopped, format, codec, bytesPerS, decodeMs,
//                                       video (h264: H264Decoder.stats), formatFallback, ...)
//   tts             SpeechPanel.state  (chunks, bytes, cancelled, ttfaMs, available, reason, retries,
//                                       retryStopped, ...)
//   robot           RobotPanel.state   (policies, placeholder, canDrive, running, frame, calls, chunks, result, ...)
//   panels          the panel objects themselves
//   auth            {required, refusals, error}: the server asked for an API key (401), how many
//                   keys it refused, the message the key field shows (null: none)

import { apiKey, keyProblem, setApiKey, takeKeyFromFragment } from "./api_key.js";
import { $, showError } from "./dom.js";
import { askForKey } from "./key_form.js";
import { Unauthorized, fetchHealth, fetchModelsWhenLoaded, loadingLine } from "./net.js";
import { RobotPanel } from "./robot.js";
import { SpeechPanel } from "./speech.js";
import { WorldPanel } from "./world.js";

const HEALTH_EVERY_MS = 10_000;

window.demo = { ready: false, bootError: null, loading: [], models: [], world: null, tts: null, robot: null,
                panels: {}, auth: { required: false, refusals: 0, error: null } };

async function checkHealth() {
  const pill = $("health");
  try {
    const { ok, text } = await fetchHealth();
    pill.dataset.state = ok ? "ok" : "bad";
    pill.textContent = ok ? "server: ok" : `server: ${text}`;
  } catch (err) {
    pill.dataset.state = "bad";
    pill.textContent = "server: unreachable";
  }
}

/** A key given as `/#api_key=KEY`: held for this tab, or why it cannot be (shown if the server asks). */
function keyFromFragment() {
  const key = takeKeyFromFragment();
  if (key === null) return null;
  const problem = keyProblem(key);
  if (!problem) setApiKey(key);
  return problem && `the key in the address (#api_key=) was not used: ${problem}`;
}

/**
 * The model list. A server with API keys answers 401 until the tab holds a valid key:
 * the key field asks for one, and again (saying so) after the server refused it.
 */
async function loadModels(onProgress) {
  const auth = window.demo.auth;
  let message = keyFromFragment();
  for (;;) {
    try {
      return await fetchModelsWhenLoaded(onProgress);
    } catch (err) {
      if (!(err instanceof Unauthorized)) throw err;
      auth.required = true;
      if (apiKey() !== null) {
        // A refused key is not kept: a reload must not send it again.
        setApiKey(null);
        auth.refusals += 1;
        message = "the server refused this key (HTTP 401 unauthorized): check it and try again";
      }
      await askForKey(message, (text) => { auth.error = text || null; });
      auth.error = null;
      message = null;
    }
  }
}

async function boot() {
  checkHealth();
  setInterval(checkHealth, HEALTH_EVERY_MS);
  // A server still loading its models refuses sessions: show how far it has got, then start.
  const line = $("loading");
  const models = await loadModels((m) => {
    const text = loadingLine(m);
    if (text !== line.textContent) window.demo.loading.push(text);
    line.textContent = text;
    line.hidden = false;
  });
  line.hidden = true;
  checkHealth();
  window.demo.models = models;
  const panels = { world: new WorldPanel(models), speech: new SpeechPanel(models), robot: new RobotPanel(models) };
  window.demo.panels = panels;
  window.demo.world = panels.world.state;
  window.demo.tts = panels.speech.state;
  window.demo.robot = panels.robot.state;
  await Promise.all(Object.values(panels).map((panel) => panel.start()));
  window.demo.ready = true;
}

boot().catch((err) => {
  window.demo.bootError = String(err);
  showError($("boot-error"), `cannot start the demo: ${err}`);
});
