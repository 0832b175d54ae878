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

const WITH_OFFSET = /^(\d{4}-\d{2}-\d{2})[Tt ](\d{2}):(\d{2})(?::(\d{2})(\.\d{1,6})?)?([Zz]|[+-]\d{2}:\d{2})$/;

/**
 * Microseconds of an ISO 8601 / RFC 3339 time with its UTC offset, in any zone
 * (`2026-12-01T08:00:00+01:00`, `2026-12-01 08:00Z`): what a roster's key validity and a
 * worker's start time are written as. Null when `text` is not such a time (one without
 * an offset included: it would mean a different instant on every machine).
 */
export function parseInstant(text: string): Micros | null {
  const match = WITH_OFFSET.exec(text.trim());
  if (match === null) return null;
  const [, date, hours, minutes, seconds, fraction, zone] = match as unknown as string[];
  let utc: Micros;
  try {
    utc = parseUtc(`${date}T${hours}:${minutes}:${seconds ?? '00'}${fraction ?? ''}Z`);
  } catch (error) {
    if (error instanceof TimeError) return null;
    throw error;
  }
  if (zone!.toUpperCase() === 'Z') return utc;
  const minutesEast = (zone!.startsWith('-') ? -1 : 1) * (Number(zone!.slice(1, 3)) * 60 + Number(zone!.slice(4, 6)));
  return utc - minutesEast * 60_000_000;
}
