{
  "digest": "sha256:b644458624de3d014f102839098776c20b3c0bad13f258a04e90179c92394e54",
  "key_id": "ed25519:d9425a7d2ce0a66c",
  "name": "payment-refund",
  "publisher": "agent-recovery-catalogue",
  "signature": "1r+EcCZRZnfFkXPMdRrYaqZCMO4p2K/LoLvp2L+7TDG2ZkJX1YZp6q2EWzhEa/5ot5N9oDSzPzkjOb0btOGaCw==",
  "signature_version": 1,
  "version": "1.0.0"
}
