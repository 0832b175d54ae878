/**
 * Ed25519 keys with Node's own `crypto`: a private key file is PEM (PKCS#8) or the
 * base64 of the 32-byte seed; a public key travels as the base64 of its 32 raw bytes and
 * is named by its key id, `ed25519:` and the first 16 hex digits of SHA-256 of those bytes.
 */
import { createHash, createPrivateKey, createPublicKey, sign, verify, type KeyObject } from 'node:crypto';
import { readFileSync } from 'node:fs';

const PKCS8_SEED_PREFIX = Buffer.from('302e020100300506032b657004220420', 'hex');
const SPKI_PREFIX = Buffer.from('302a300506032b6570032100', 'hex');
const BASE64 = /^(?:[A-Za-z0-9+/]{4})*(?:[A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=)?$/;

export class KeyError extends Error {
  override name = 'KeyError';
}

/** Strict base64 (RFC 4648 alphabet, padded): what a verifier accepts. */
export function decodeBase64(text: string): Buffer | null {
  return BASE64.test(text) ? Buffer.from(text, 'base64') : null;
}

export function privateKeyFromSeed(seed: Buffer): KeyObject {
  if (seed.length !== 32) throw new KeyError(`an Ed25519 seed is 32 bytes, not ${seed.length}`);
  return createPrivateKey({ key: Buffer.concat([PKCS8_SEED_PREFIX, seed]), format: 'der', type: 'pkcs8' });
}

export function publicKeyFromRaw(raw: Buffer): KeyObject {
  if (raw.length !== 32) throw new KeyError(`an Ed25519 public key is 32 bytes, not ${raw.length}`);
  return createPublicKey({ key: Buffer.concat([SPKI_PREFIX, raw]), format: 'der', type: 'spki' });
}

export function rawPublicKey(key: KeyObject): Buffer {
  const pub = key.type === 'public' ? key : createPublicKey(key);
  const der = pub.export({ format: 'der', type: 'spki' });
  return der.subarray(der.length - 32);
}

export function publicKeyText(key: KeyObject): string {
  return rawPublicKey(key).toString('base64');
}

export function keyId(key: KeyObject): string {
  return 'ed25519:' + createHash('sha256').update(rawPublicKey(key)).digest('hex').slice(0, 16);
}

/** The private key in `path`: PEM PKCS#8 or the base64 of the raw seed. */
export function loadPrivateKey(path: string): KeyObject {
  let data: Buffer;
  try {
    data = readFileSync(path);
  } catch (error) {
    throw new KeyError(`key file ${path} cannot be read (${(error as Error).message})`);
  }
  const text = data.toString('utf8').trim();
  if (text.startsWith('-----BEGIN')) {
    let key: KeyObject;
    try {
      key = createPrivateKey({ key: text, format: 'pem' });
    } catch (error) {
      throw new KeyError(`key file ${path} is not a PEM private key (${(error as Error).message})`);
    }
    if (key.asymmetricKeyType !== 'ed25519') throw new KeyError(`key file ${path} holds a ${key.asymmetricKeyType} key, not Ed25519`);
    return key;
  }
  const seed = decodeBase64(text);
  if (seed === null) throw new KeyError(`key file ${path} is neither PEM nor base64`);
  return privateKeyFromSeed(seed);
}

export function ed25519Sign(key: KeyObject, message: Buffer): Buffer {
  return sign(null, message, key);
}

/** Whether `signature` (64 bytes) signs `message` under `key`; false for any other length. */
export function ed25519Verify(key: KeyObject, signature: Buffer, message: Buffer): boolean {
  if (signature.length !== 64) return false;
  try {
    return verify(null, message, key, signature);
  } catch {
    return false;
  }
}

export function sha256Hex(data: Buffer | string): string {
  return createHash('sha256').update(data).digest('hex');
}
