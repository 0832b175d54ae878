{
  "digest": "sha256:062be6035b36e629c89839c087b7656b3d0dd2e01f0bb44858b80fafcfcf76c3",
  "key_id": "ed25519:d9425a7d2ce0a66c",
  "name": "procurement-request",
  "publisher": "agent-recovery-catalogue",
  "signature": "kko/slWzs2G2Ajpp72f9GA+WvzdAiEgVbrn/BTO4QDNpDuY+rLyjVwSnC9qc205H8Mex+qe9UupZMkE23gIiDw==",
  "signature_version": 1,
  "version": "1.0.0"
}
