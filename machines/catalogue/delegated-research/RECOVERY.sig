{
  "digest": "sha256:e570eb2d80ecab02f06e4caf39f1c672c40f7838aefde291866eecf0e2124fa8",
  "key_id": "ed25519:d9425a7d2ce0a66c",
  "name": "delegated-research",
  "publisher": "agent-recovery-catalogue",
  "signature": "9isgVr4VvzQqsEYNJ7L9KIhFFtALq2AINdWeYSWEkdkfwPzPuY3SRCryDJaqd82ovqALRBsB/FD/BW6YeQI2AQ==",
  "signature_version": 1,
  "version": "1.0.0"
}
