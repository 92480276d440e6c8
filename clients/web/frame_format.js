// The frame format a world session asks for (the format menu), and the decoder it gets.
//
// jpeg and png are decoded image by image (frames.js ImageFrames); h264 is one stream per
// session, decoded with WebCodecs (h264_decoder.js). h264 is asked for only where it can be
// shown; otherwise the page falls back to jpeg, the menu shows jpeg, and `fallback` says why:
//
//   no VideoDecoder, or it cannot decode PROBE_CODEC    before the create: jpeg is asked for
//   the server answers format_unavailable                the world panel creates again, jpeg
//   session.created's codec is not supported here        the world panel closes it, jpeg

import { H264Decoder, h264Unsupported } from "./h264_decoder.js";

// Asked about before an h264 session is created (constrained baseline, level 3.1, what the
// server sends by default); the session's own codec string is checked once it is known.
const PROBE_CODEC = "avc1.42C01F";

export class FrameFormat {
  /** @param {HTMLSelectElement} menu  the format menu (jpeg, png, h264) */
  constructor(menu) {
    this.menu = menu;
    this.h264Missing = null; // why this browser cannot decode h264 (probe), or null
    this.fallback = null; // why the page asked for jpeg instead of h264, or null
  }

  /** Ask the browser once whether it decodes h264. */
  async probe() {
    this.h264Missing = await h264Unsupported(PROBE_CODEC);
  }

  /** The format to create with: the menu's, unless h264 cannot be decoded here. */
  pick() {
    if (this.menu.value === "h264" && this.h264Missing) this.fallBack(this.h264Missing);
    return this.menu.value;
  }

  /** h264 is out of reach (`why`): jpeg from now on, until the person picks h264 again. */
  fallBack(why) {
    this.fallback = why;
    this.menu.value = "jpeg";
  }

  /**
   * The decoder for a created session: an H264Decoder for h264, null (images) otherwise.
   * @param {() => void} askKeyFrame  sends `{"type": "keyframe"}` on the session
   * @param {(why: string) => void} unsupported  the browser cannot decode the session's codec
   */
  decoderFor(created, askKeyFrame, unsupported) {
    if (created.format !== "h264") return null;
    this.fallback = null;
    return new H264Decoder(created.codec, askKeyFrame, unsupported);
  }
}

/** The HUD's video line: format, bitrate and decode time, e.g. "h264 · 41 kB/s · decode 1.2 ms". */
export function videoLine({ format, bytesPerS, decodeMs }) {
  const rate = bytesPerS >= 1e6 ? `${(bytesPerS / 1e6).toFixed(2)} MB/s` : `${(bytesPerS / 1e3).toFixed(0)} kB/s`;
  const decode = decodeMs === null ? "–" : `${decodeMs.toFixed(1)} ms`;
  return `${format} · ${rate} · decode ${decode}`;
}
