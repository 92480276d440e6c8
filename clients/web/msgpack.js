// msgpack with openpi-client's numpy extension: the OpenPI wire format in the browser.
//
// The byte rules are protocols/openpi.py's (read off openpi_client.msgpack_numpy), and
// `pack` gives exactly the bytes of Python's `msgpack.packb(obj, default=pack_array)`
// for the same value (tests/e2e/test_web_robot.py compares them):
//
//   null, booleans                         nil, false/true
//   safe integers (|n| < 2**53), BigInt    the smallest int form: positive as uint, negative as int
//   other numbers                          float 64 (Python's float)
//   strings                                str (UTF-8), fixstr / str 8 / 16 / 32
//   Uint8Array (not an NdArray)            bin 8 / 16 / 32 (Python bytes)
//   arrays                                 array (Python list or tuple)
//   plain objects                          map with str keys, in insertion order
//   NdArray                                {b"__ndarray__": True, b"data": bin, b"dtype": str, b"shape": [..]}
//
// `unpack` reads any of those forms (and float 32, fixext is refused) and turns the
// numpy maps back into NdArray (`__npgeneric__` scalars into numbers). It is bounded:
// nesting at most MAX_DEPTH, every length checked against the bytes left, so a
// truncated or hostile message throws a MsgpackError instead of reading past the end.

export const MAX_DEPTH = 32;

export class MsgpackError extends Error {}

// numpy dtype strings (little-endian or byte-order free) -> typed array constructors.
const DTYPES = {
  "|u1": Uint8Array, "|i1": Int8Array, "|b1": Uint8Array,
  "<u2": Uint16Array, "<i2": Int16Array, "<u4": Uint32Array, "<i4": Int32Array,
  "<u8": BigUint64Array, "<i8": BigInt64Array, "<f4": Float32Array, "<f8": Float64Array,
};

/** A numpy array on the wire: `dtype` (numpy's `dtype.str`), `shape`, `data` (a typed array, C order). */
export class NdArray {
  constructor(dtype, shape, data) {
    const Type = DTYPES[dtype];
    if (!Type) throw new MsgpackError(`unsupported array dtype ${JSON.stringify(dtype)}`);
    const count = shape.reduce((a, b) => a * b, 1);
    if (!(data instanceof Type) || data.length !== count) {
      throw new MsgpackError(`array of ${dtype} [${shape}] needs a ${Type.name} of ${count}`);
    }
    this.dtype = dtype;
    this.shape = shape;
    this.data = data;
  }

  /** Row `i` of a 2-D array, as a plain array of numbers. */
  row(i) {
    if (this.shape.length !== 2) throw new MsgpackError(`row() of a ${this.shape.length}-D array`);
    const n = this.shape[1];
    return Array.from(this.data.subarray(i * n, (i + 1) * n), Number);
  }
}

// ---------------------------------------------------------------------------- pack
class Writer {
  constructor() {
    this.buf = new Uint8Array(1024);
    this.view = new DataView(this.buf.buffer);
    this.n = 0;
  }

  room(k) {
    if (this.n + k <= this.buf.length) return;
    let size = this.buf.length * 2;
    while (size < this.n + k) size *= 2;
    const next = new Uint8Array(size);
    next.set(this.buf.subarray(0, this.n));
    this.buf = next;
    this.view = new DataView(next.buffer);
  }

  byte(b) { this.room(1); this.buf[this.n++] = b; }
  u8(tag, v) { this.room(2); this.buf[this.n++] = tag; this.buf[this.n++] = v; }
  u16(tag, v) { this.room(3); this.buf[this.n++] = tag; this.view.setUint16(this.n, v); this.n += 2; }
  u32(tag, v) { this.room(5); this.buf[this.n++] = tag; this.view.setUint32(this.n, v); this.n += 4; }
  bytes(b) { this.room(b.length); this.buf.set(b, this.n); this.n += b.length; }
  done() { return this.buf.slice(0, this.n); }
}

const encoder = new TextEncoder();

function packInt(w, v) {
  // v: a BigInt (any integer is packed through BigInt past 32 bits, exactly).
  if (v >= 0n) {
    if (v < 128n) w.byte(Number(v));
    else if (v < 256n) w.u8(0xcc, Number(v));
    else if (v < 65536n) w.u16(0xcd, Number(v));
    else if (v < 4294967296n) w.u32(0xce, Number(v));
    else if (v < 18446744073709551616n) { w.room(9); w.buf[w.n++] = 0xcf; w.view.setBigUint64(w.n, v); w.n += 8; }
    else throw new MsgpackError(`integer ${v} is over 64 bits`);
  } else if (v >= -32n) w.byte(Number(v) & 0xff);
  else if (v >= -128n) w.u8(0xd0, Number(v) & 0xff);
  else if (v >= -32768n) w.u16(0xd1, Number(v) & 0xffff);
  else if (v >= -2147483648n) w.u32(0xd2, Number(v) >>> 0);
  else if (v >= -9223372036854775808n) { w.room(9); w.buf[w.n++] = 0xd3; w.view.setBigInt64(w.n, v); w.n += 8; }
  else throw new MsgpackError(`integer ${v} is over 64 bits`);
}

function packLength(w, n, fix, fixMax, t8, t16, t32) {
  if (n <= fixMax && fix !== null) w.byte(fix | n);
  else if (n < 256 && t8 !== null) w.u8(t8, n);
  else if (n < 65536) w.u16(t16, n);
  else w.u32(t32, n);
}

function packStr(w, s) {
  const b = encoder.encode(s);
  packLength(w, b.length, 0xa0, 31, 0xd9, 0xda, 0xdb);
  w.bytes(b);
}

function packBin(w, b) {
  packLength(w, b.length, null, -1, 0xc4, 0xc5, 0xc6);
  w.bytes(b);
}

function packValue(w, v, depth) {
  if (depth > MAX_DEPTH) throw new MsgpackError(`nested deeper than ${MAX_DEPTH}`);
  if (v === null || v === undefined) w.byte(0xc0);
  else if (v === false) w.byte(0xc2);
  else if (v === true) w.byte(0xc3);
  else if (typeof v === "bigint") packInt(w, v);
  else if (typeof v === "number") {
    // Past 2**53 a Number is no exact integer: it goes as the float it is (a BigInt as an int).
    if (Number.isSafeInteger(v)) packInt(w, BigInt(v));
    else { w.room(9); w.buf[w.n++] = 0xcb; w.view.setFloat64(w.n, v); w.n += 8; }
  } else if (typeof v === "string") packStr(w, v);
  else if (v instanceof NdArray) {
    // pack_array's map, keys as bytes (msgpack bin), in its order.
    w.byte(0x84);
    packBin(w, encoder.encode("__ndarray__"));
    w.byte(0xc3);
    packBin(w, encoder.encode("data"));
    packBin(w, new Uint8Array(v.data.buffer, v.data.byteOffset, v.data.byteLength));
    packBin(w, encoder.encode("dtype"));
    packStr(w, v.dtype);
    packBin(w, encoder.encode("shape"));
    packValue(w, v.shape, depth + 1);
  } else if (v instanceof Uint8Array) packBin(w, v);
  else if (Array.isArray(v)) {
    packLength(w, v.length, 0x90, 15, null, 0xdc, 0xdd);
    for (const item of v) packValue(w, item, depth + 1);
  } else if (typeof v === "object") {
    const entries = Object.entries(v);
    packLength(w, entries.length, 0x80, 15, null, 0xde, 0xdf);
    for (const [key, item] of entries) {
      packStr(w, key);
      packValue(w, item, depth + 1);
    }
  } else throw new MsgpackError(`cannot pack a ${typeof v}`);
}

/** `value` as msgpack bytes (Uint8Array), numpy-extension style for NdArray. */
export function pack(value) {
  const w = new Writer();
  packValue(w, value, 0);
  return w.done();
}

// ---------------------------------------------------------------------------- unpack
const decoder = new TextDecoder("utf-8", { fatal: true });

class Reader {
  constructor(bytes) {
    this.b = bytes;
    this.view = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
    this.i = 0;
  }

  need(k) {
    if (this.i + k > this.b.length) throw new MsgpackError(`truncated message: ${k} bytes wanted at ${this.i} of ${this.b.length}`);
  }

  u8() { this.need(1); return this.b[this.i++]; }
  u16() { this.need(2); const v = this.view.getUint16(this.i); this.i += 2; return v; }
  u32() { this.need(4); const v = this.view.getUint32(this.i); this.i += 4; return v; }
  take(k) { this.need(k); const out = this.b.subarray(this.i, this.i + k); this.i += k; return out; }
  big(signed) {
    this.need(8);
    const v = signed ? this.view.getBigInt64(this.i) : this.view.getBigUint64(this.i);
    this.i += 8;
    // A number when it is one exactly (every count and seed here), else a BigInt.
    return v >= BigInt(Number.MIN_SAFE_INTEGER) && v <= BigInt(Number.MAX_SAFE_INTEGER) ? Number(v) : v;
  }
}

function readValue(r, depth) {
  if (depth > MAX_DEPTH) throw new MsgpackError(`nested deeper than ${MAX_DEPTH}`);
  const t = r.u8();
  if (t < 0x80) return t;
  if (t >= 0xe0) return t - 256;
  if ((t & 0xf0) === 0x80) return readMap(r, t & 0x0f, depth);
  if ((t & 0xf0) === 0x90) return readArray(r, t & 0x0f, depth);
  if ((t & 0xe0) === 0xa0) return decoder.decode(r.take(t & 0x1f));
  switch (t) {
    case 0xc0: return null;
    case 0xc2: return false;
    case 0xc3: return true;
    case 0xc4: return r.take(r.u8()).slice();
    case 0xc5: return r.take(r.u16()).slice();
    case 0xc6: return r.take(r.u32()).slice();
    case 0xca: { r.need(4); const v = r.view.getFloat32(r.i); r.i += 4; return v; }
    case 0xcb: { r.need(8); const v = r.view.getFloat64(r.i); r.i += 8; return v; }
    case 0xcc: return r.u8();
    case 0xcd: return r.u16();
    case 0xce: return r.u32();
    case 0xcf: return r.big(false);
    case 0xd0: { const v = r.u8(); return v > 127 ? v - 256 : v; }
    case 0xd1: { const v = r.u16(); return v > 32767 ? v - 65536 : v; }
    case 0xd2: { r.need(4); const v = r.view.getInt32(r.i); r.i += 4; return v; }
    case 0xd3: return r.big(true);
    case 0xd9: return decoder.decode(r.take(r.u8()));
    case 0xda: return decoder.decode(r.take(r.u16()));
    case 0xdb: return decoder.decode(r.take(r.u32()));
    case 0xdc: return readArray(r, r.u16(), depth);
    case 0xdd: return readArray(r, r.u32(), depth);
    case 0xde: return readMap(r, r.u16(), depth);
    case 0xdf: return readMap(r, r.u32(), depth);
    default: throw new MsgpackError(`unsupported msgpack type 0x${t.toString(16)} at ${r.i - 1}`);
  }
}

function readArray(r, n, depth) {
  r.need(n); // every item takes at least one byte: a huge count fails before any allocation
  const out = new Array(n);
  for (let k = 0; k < n; k++) out[k] = readValue(r, depth + 1);
  return out;
}

function readMap(r, n, depth) {
  r.need(2 * n);
  const out = {};
  for (let k = 0; k < n; k++) {
    let key = readValue(r, depth + 1);
    if (key instanceof Uint8Array) key = decoder.decode(key); // numpy's bytes keys
    if (typeof key !== "string") throw new MsgpackError(`map key of type ${typeof key}: only str or bytes keys`);
    out[key] = readValue(r, depth + 1);
  }
  if (out.__ndarray__ === true) return toNdArray(out);
  if (out.__npgeneric__ === true) return out.data;
  return out;
}

function toNdArray(m) {
  const Type = DTYPES[m.dtype];
  if (!Type) throw new MsgpackError(`unsupported array dtype ${JSON.stringify(m.dtype)}`);
  if (!(m.data instanceof Uint8Array) || !Array.isArray(m.shape) || !m.shape.every((d) => Number.isInteger(d) && d >= 0)) {
    throw new MsgpackError("array needs bytes data and a shape of non-negative ints");
  }
  const count = m.shape.reduce((a, b) => a * b, 1);
  if (count * Type.BYTES_PER_ELEMENT !== m.data.length) {
    throw new MsgpackError(`array data has ${m.data.length} bytes, [${m.shape}] of ${m.dtype} needs ${count * Type.BYTES_PER_ELEMENT}`);
  }
  // m.data is a fresh copy (readValue slices bins), so its buffer is aligned and owned.
  return new NdArray(m.dtype, m.shape, new Type(m.data.buffer, 0, count));
}

/** One msgpack message (Uint8Array or ArrayBuffer) -> its value; MsgpackError if malformed. */
export function unpack(bytes) {
  const b = bytes instanceof Uint8Array ? bytes : new Uint8Array(bytes);
  const r = new Reader(b);
  const value = readValue(r, 0);
  if (r.i !== b.length) throw new MsgpackError(`${b.length - r.i} bytes after the message`);
  return value;
}
