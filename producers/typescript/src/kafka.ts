/**
 * Kafka client settings, from the same variables the Python components read
 * (docs/operations.md, "Kafka security"): `RECOVERY_KAFKA_BOOTSTRAP`,
 * `RECOVERY_KAFKA_CONFIG_FILE` (a librdkafka properties file, as `recoveryctl stack up`
 * writes one per principal), and `RECOVERY_KAFKA_SECURITY_PROTOCOL`, `..._SASL_MECHANISM`,
 * `..._SASL_USERNAME`, `..._SASL_PASSWORD` (or `..._SASL_PASSWORD_FILE`) and
 * `..._SSL_CA_LOCATION`, which override the file. The client is librdkafka
 * (`@confluentinc/kafka-javascript`), so these are passed to it as they are.
 */
import { readFileSync } from 'node:fs';

export type KafkaSettings = Record<string, string | number | boolean>;

export function readProperties(path: string): Record<string, string> {
  const config: Record<string, string> = {};
  readFileSync(path, 'utf8')
    .split(/\r?\n/)
    .forEach((raw, index) => {
      const line = raw.trim();
      if (!line || line.startsWith('#')) return;
      const at = line.indexOf('=');
      if (at <= 0) throw new Error(`${path} line ${index + 1} is not key=value`);
      config[line.slice(0, at).trim()] = line.slice(at + 1).trim();
    });
  return config;
}

/** librdkafka settings for `bootstrap` from the environment (see the module comment). */
export function kafkaSettings(bootstrap?: string, env: NodeJS.ProcessEnv = process.env): KafkaSettings {
  const servers = bootstrap ?? env['RECOVERY_KAFKA_BOOTSTRAP'];
  if (!servers) throw new Error('no Kafka bootstrap servers: pass them or set RECOVERY_KAFKA_BOOTSTRAP');
  const config: KafkaSettings = {};
  const file = env['RECOVERY_KAFKA_CONFIG_FILE'];
  if (file) Object.assign(config, readProperties(file));
  const overrides: Array<[string, string | undefined]> = [
    ['security.protocol', env['RECOVERY_KAFKA_SECURITY_PROTOCOL']],
    ['sasl.mechanism', env['RECOVERY_KAFKA_SASL_MECHANISM']],
    ['sasl.username', env['RECOVERY_KAFKA_SASL_USERNAME']],
    ['sasl.password', env['RECOVERY_KAFKA_SASL_PASSWORD'] ?? readSecret(env['RECOVERY_KAFKA_SASL_PASSWORD_FILE'])],
    ['ssl.ca.location', env['RECOVERY_KAFKA_SSL_CA_LOCATION']],
  ];
  for (const [key, value] of overrides) if (value) config[key] = value;
  if (config['sasl.mechanisms'] !== undefined && config['sasl.mechanism'] === undefined) {
    config['sasl.mechanism'] = config['sasl.mechanisms']!;
    delete config['sasl.mechanisms'];
  }
  if (config['sasl.username'] && config['security.protocol'] === undefined) config['security.protocol'] = 'SASL_SSL';
  if (config['sasl.username'] && config['sasl.mechanism'] === undefined) config['sasl.mechanism'] = 'SCRAM-SHA-512';
  config['bootstrap.servers'] = servers;
  return config;
}

function readSecret(path: string | undefined): string | undefined {
  return path ? readFileSync(path, 'utf8').trim() : undefined;
}

/** The partition of a record with key `key` among `partitions`: CRC-32 (ISO-HDLC, as
 * zlib) of the key bytes modulo the count, librdkafka's `consistent_random` for keyed
 * records, which every component uses (docs/wire-protocol.md, "Topics and keys"). */
export function partitionFor(key: Buffer, partitions: number): number {
  return crc32(key) % partitions;
}

export function crc32(data: Buffer): number {
  let crc = 0xffffffff;
  for (const byte of data) {
    crc ^= byte;
    for (let k = 0; k < 8; k++) crc = crc & 1 ? (crc >>> 1) ^ 0xedb88320 : crc >>> 1;
  }
  return (crc ^ 0xffffffff) >>> 0;
}
