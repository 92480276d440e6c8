// H.264 access units in Annex B (world.v1 `format: "h264"`): which NAL units one holds.
//
// Annex B separates NAL units with start codes, 00 00 01 or 00 00 00 01; the byte after a
// start code is the NAL header, whose low 5 bits are the unit's type:
//
//   00 00 00 01 67 ..SPS.. 00 00 00 01 68 ..PPS.. 00 00 01 65 ..IDR slice..
//               └ 7                    └ 8                └ 5
//
// The encoder's payload never holds 00 00 01 (emulation prevention inserts 03), so every
// start code found is a real one. An access unit with an IDR slice (type 5) starts a new
// decodable run: it is the only kind a decoder may begin from, or resume from after a gap.

export const NAL_IDR = 5;

/** The NAL unit types of one Annex B access unit, in order. */
export function nalTypes(bytes) {
  const types = [];
  for (let i = 0; i + 3 < bytes.length; i++) {
    if (bytes[i] === 0 && bytes[i + 1] === 0 && bytes[i + 2] === 1) {
      types.push(bytes[i + 3] & 0x1f);
      i += 3;
    }
  }
  return types;
}

/** True when the access unit holds an IDR slice (WebCodecs `type: "key"`). */
export function isKeyFrame(bytes) {
  return nalTypes(bytes).includes(NAL_IDR);
}
