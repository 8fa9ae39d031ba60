"""Tokens for the MCP gateway's login test (tests/tests/mcp_gateway.rs),
signed with RSA keys made here (pyjwt, cryptography):

    python jwt_tokens.py ISSUER AUDIENCE

Prints one JSON object: the issuer's JWKS (for Envoy's jwt_authn), a valid
token for the `readers` team, an expired one, one signed by a key the
issuer does not have, one for another audience.
"""
import json
import sys
import time

import jwt
from cryptography.hazmat.primitives.asymmetric import rsa
from jwt.algorithms import RSAAlgorithm

issuer, audience = sys.argv[1], sys.argv[2]
key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
other = rsa.generate_private_key(public_exponent=65537, key_size=2048)
jwk = json.loads(RSAAlgorithm.to_jwk(key.public_key()))
jwk.update({"kid": "test-key", "alg": "RS256", "use": "sig"})
now = int(time.time())


def token(signer=key, aud=audience, exp=now + 600, **claims):
    payload = {"iss": issuer, "aud": aud, "sub": "ada@example.com", "iat": now, "exp": exp, **claims}
    return jwt.encode(payload, signer, algorithm="RS256", headers={"kid": "test-key"})


print(json.dumps({
    "jwks": json.dumps({"keys": [jwk]}),
    "valid": token(groups=["staff", "readers"]),
    "expired": token(exp=now - 60, groups=["readers"]),
    "foreign": token(signer=other, groups=["readers"]),
    "audience": token(aud="https://elsewhere.example.com", groups=["readers"]),
}))
