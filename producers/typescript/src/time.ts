/**
 * Times on the wire are UTC instants with microsecond precision: Avro carries them as
 * `timestamp-micros` (a long), JSON as RFC 3339 with `Z` or `+00:00` and at most six
 * fractional digits. What is hashed or signed is their ISO-8601 form as the protocol
 * writes it: `YYYY-MM-DDTHH:MM:SS+00:00`, with `.ffffff` (six digits) only when the
 * microseconds are not zero (docs/wire-protocol.md, "Times").
 */

/** Microseconds since 1970-01-01T00:00:00Z. */
export type Micros = number;

const RFC3339_UTC = /^(\d{4})-(\d{2})-(\d{2})T(\d{2}):(\d{2}):(\d{2})(?:\.(\d{1,6}))?(?:Z|\+00:00)$/;

export class TimeError extends Error {
  override name = 'TimeError';
}

/** Microseconds of an RFC 3339 UTC time (`Z` or `+00:00`, at most 6 fractional digits). */
export function parseUtc(text: string): Micros {
  const match = RFC3339_UTC.exec(text);
  if (match === null) {
    throw new TimeError(`time ${JSON.stringify(text)} is not RFC 3339 in UTC (Z or +00:00, at most microseconds)`);
  }
  const [, y, mo, d, h, mi, s, fraction] = match;
  const millis = Date.UTC(Number(y), Number(mo) - 1, Number(d), Number(h), Number(mi), Number(s));
  const check = new Date(millis);
  if (check.getUTCDate() !== Number(d) || check.getUTCMonth() !== Number(mo) - 1) {
    throw new TimeError(`time ${JSON.stringify(text)} is not a calendar date`);
  }
  return millis * 1000 + Number((fraction ?? '').padEnd(6, '0'));
}

export function fromDate(date: Date): Micros {
  return date.getTime() * 1000;
}

export function toDate(micros: Micros): Date {
  return new Date(Math.floor(micros / 1000));
}

/** The protocol's ISO-8601 form: `2026-06-01T12:00:00+00:00`, `...:00.250000+00:00`. */
export function isoformat(micros: Micros): string {
  if (!Number.isSafeInteger(micros)) throw new TimeError(`${micros} is not a whole number of microseconds`);
  const millis = Math.floor(micros / 1000);
  const rest = micros - millis * 1000;
  const date = new Date(millis);
  const base = date.toISOString().slice(0, 19);
  const fraction = date.getUTCMilliseconds() * 1000 + rest;
  return fraction === 0 ? `${base}+00:00` : `${base}.${String(fraction).padStart(6, '0')}+00:00`;
}

export function nowMicros(): Micros {
  return Date.now() * 1000;
}
