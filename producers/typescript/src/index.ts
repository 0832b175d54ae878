/** @agent-recovery/client: the wire protocol agent-recovery-wire/1 in TypeScript. */
export * from './avro.js';
export * from './callcontext.js';
export * from './canonical.js';
export * from './client.js';
export * from './command.js';
export * from './envelope.js';
export * from './headers.js';
export * from './kafka.js';
export * from './jsonschema.js';
export * from './keys.js';
export * from './reader.js';
export * from './roster.js';
export * from './signing.js';
export * from './store.js';
export * from './time.js';
export * from './worker.js';
