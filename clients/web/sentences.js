// Streaming a text box to tts.v1 one finished sentence at a time.
//
// The box holds the utterance being typed. `sent` is the prefix already sent:
//
//   box:   "Hello there. How are you? I am fi"
//   sent:  "Hello there. "                       (sent earlier)
//   update ->       ["How are you? "]            (one string per finished sentence)
//   flush  ->       ["I am fi"]  + input.done    (Enter: the rest, whatever it is)
//
// A sentence ends at . ! ? … (and CJK forms), optionally followed by closing
// quotes or brackets, *and then whitespace*: "3.14" or "e.g" typed halfway do not
// end one. Text already sent cannot be taken back; if the person edits inside it,
// `sent` shrinks back to the end of the last sent piece that is still unchanged,
// and the edited sentences are sent again from there.

const SENTENCE_END = /[.!?…。！？]+["'”’)\]]*\s+/g;

/** Length of the longest prefix of `text` that ends a sentence (0 if none). */
export function completedLength(text) {
  let end = 0;
  for (const match of text.matchAll(SENTENCE_END)) end = match.index + match[0].length;
  return end;
}

function commonPrefix(a, b) {
  let i = 0;
  while (i < a.length && i < b.length && a[i] === b[i]) i += 1;
  return i;
}

export class TextStreamer {
  constructor() {
    this.sent = "";
    this.ends = []; // where each sent piece ends in `sent`
  }

  /** The box changed: the newly finished sentences to send, one string each. */
  update(value) {
    if (!value.startsWith(this.sent)) {
      const keep = commonPrefix(this.sent, value);
      while (this.ends.length && this.ends[this.ends.length - 1] > keep) this.ends.pop();
      this.sent = this.sent.slice(0, this.ends.length ? this.ends[this.ends.length - 1] : 0);
    }
    const fresh = value.slice(this.sent.length);
    const texts = [];
    let start = 0;
    for (const match of fresh.matchAll(SENTENCE_END)) {
      const end = match.index + match[0].length;
      texts.push(fresh.slice(start, end));
      this.ends.push(this.sent.length + end);
      start = end;
    }
    this.sent += fresh.slice(0, start);
    return texts;
  }

  /** Enter: everything not yet sent (maybe nothing); the utterance then starts over. */
  flush(value) {
    const texts = this.update(value);
    const rest = value.slice(this.sent.length);
    if (rest.trim()) texts.push(rest);
    this.reset();
    return texts;
  }

  reset() {
    this.sent = "";
    this.ends = [];
  }
}
