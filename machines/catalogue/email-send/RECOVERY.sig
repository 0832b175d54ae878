{
  "digest": "sha256:7a2b6581a15027a55eb38bba13c9cbed8cbd3c741172bdc9f38f5fead93f52fb",
  "key_id": "ed25519:d9425a7d2ce0a66c",
  "name": "email-send",
  "publisher": "agent-recovery-catalogue",
  "signature": "YCgcU8FQUdOrbf7RWDLyHthN9yvqVtLNK1pxNUDxTiRuUpwVIzZTspFN4WH19QGILsPEmufgX0QvSBkEQT0+CQ==",
  "signature_version": 1,
  "version": "1.0.0"
}
