{
  "digest": "sha256:105e50ef5dd0b6940831e8deb45753baf436b40ba4a5a5bcf21d0e04331b4277",
  "key_id": "ed25519:d9425a7d2ce0a66c",
  "name": "multistep-deployment",
  "publisher": "agent-recovery-catalogue",
  "signature": "ZTBhvBZ1MIZn/H1UaEAfDJ1Q6g0XF5Rcr3WJ/vI+4rxU8c85dun3xixWOHWN91aJB8YCN1/vicoa6noPkoBXCA==",
  "signature_version": 1,
  "version": "1.0.0"
}
