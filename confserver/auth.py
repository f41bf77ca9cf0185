"""Who a client is, and what it may do where.

A client proves its identity with a secret token; the server maps tokens to identities, so no
client can just claim to be the choreographer. Rules grant read, write and delete per key pattern;
the most specific matching pattern (the longest) decides. A client without a token is
"anonymous", which the default rules let read everything and write only replay requests.

The embedded server generates `auth.json` (mode 0600) in its data directory at first start, with
one token per standard identity; local services and the CLI read their token from there, so the
file's Unix permissions decide who may act as whom on this host.
"""

from __future__ import annotations

import json
import os
import secrets
from dataclasses import dataclass, field
from pathlib import Path

from confserver.errors import BadRequest, PermissionDenied
from confserver.keys import matches

ANYONE = "*"
AUTHENTICATED = "@authenticated"
ANONYMOUS = "anonymous"
ADMIN = "admin"
STANDARD_IDENTITIES = (ADMIN, "choreographer", "supervisor", "worker", "user")
AUTH_FILE_NAME = "auth.json"
TOKEN_BYTES = 24

READ, WRITE, DELETE = "read", "write", "delete"
OPERATIONS = (READ, WRITE, DELETE)


@dataclass(frozen=True)
class Rule:
    """Who may read, write and delete the keys matching `pattern` (see confserver.keys)."""

    pattern: str
    read: tuple[str, ...] = (ANYONE,)
    write: tuple[str, ...] = (AUTHENTICATED,)
    delete: tuple[str, ...] = (AUTHENTICATED,)

    def allows(self, identity: str, operation: str) -> bool:
        granted = getattr(self, operation)
        if ADMIN == identity or ANYONE in granted or identity in granted:
            return True
        return AUTHENTICATED in granted and identity != ANONYMOUS

    def to_json(self) -> dict:
        return {"pattern": self.pattern, "read": list(self.read), "write": list(self.write),
                "delete": list(self.delete)}

    @classmethod
    def from_json(cls, obj: dict) -> Rule:
        unknown = set(obj) - {"pattern", *OPERATIONS}
        if unknown or "pattern" not in obj:
            raise BadRequest(f"auth rule {obj!r}: needs 'pattern', may have read/write/delete")
        return cls(obj["pattern"], *(tuple(obj.get(op, getattr(cls, op))) for op in OPERATIONS))


_CHOREOGRAPHER_ONLY = ("choreographer",)
DEFAULT_RULES = (
    Rule(""),  # every key: anyone reads, any authenticated client writes
    Rule("replays", write=(ANYONE,), delete=(ANYONE,)),
    # A relayed replay's result: the supervisor writes it, its client (any identity, from any host) reads
    # and deletes it once read.
    Rule("replay-results", write=("supervisor",), delete=(ANYONE,)),
    Rule("sites/*/workers/*/*/worker", write=_CHOREOGRAPHER_ONLY, delete=_CHOREOGRAPHER_ONLY),
)


@dataclass
class AuthConfig:
    tokens: dict[str, str] = field(default_factory=dict)  # token -> identity
    rules: tuple[Rule, ...] = DEFAULT_RULES

    def identify(self, token: str | None) -> str:
        """The identity a token proves; anonymous without one; PermissionDenied for a bad one."""
        if not token:
            return ANONYMOUS
        identity = self.tokens.get(token)
        if identity is None:
            raise PermissionDenied("unknown token: the confserver does not know this client")
        return identity

    def rule_for(self, key: str) -> Rule:
        best = None
        for rule in self.rules:
            if matches(rule.pattern, key) and (best is None or len(rule.pattern) > len(best.pattern)):
                best = rule
        return best or Rule("")

    def check(self, identity: str, operation: str, key: str) -> None:
        if not self.rule_for(key).allows(identity, operation):
            raise PermissionDenied(refusal(identity, operation, key))

    def token_of(self, identity: str) -> str | None:
        for token, who in self.tokens.items():
            if who == identity:
                return token
        return None

    def to_json(self) -> dict:
        return {"tokens": {who: token for token, who in self.tokens.items()},
                "rules": [rule.to_json() for rule in self.rules]}

    @classmethod
    def from_json(cls, obj: dict) -> AuthConfig:
        tokens = obj.get("tokens", {})
        if not isinstance(tokens, dict):
            raise BadRequest("auth file: 'tokens' maps identities to tokens")
        rules = tuple(Rule.from_json(r) for r in obj["rules"]) if "rules" in obj else DEFAULT_RULES
        return cls({token: who for who, token in tokens.items()}, rules)


def load(path: str | os.PathLike) -> AuthConfig:
    try:
        return AuthConfig.from_json(json.loads(Path(path).read_text()))
    except FileNotFoundError:
        raise BadRequest(f"auth file {path}: not found") from None
    except (json.JSONDecodeError, AttributeError, KeyError, TypeError) as e:
        raise BadRequest(f"auth file {path}: malformed ({e})") from None


def load_or_create(path: str | os.PathLike) -> AuthConfig:
    """The auth file at path, created with fresh tokens for the standard identities if absent."""
    path = Path(path)
    if path.exists():
        return load(path)
    config = AuthConfig({secrets.token_urlsafe(TOKEN_BYTES): who for who in STANDARD_IDENTITIES})
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(config.to_json(), f, indent=2)
    os.replace(tmp, path)
    return config


def refusal(identity: str, operation: str, key: str) -> str:
    """What a client is told of an operation its identity may not do; a client without a token is
    told how to get one."""
    if identity == ANONYMOUS:
        return (f"{identity} may not {operation} {key} (this client has no token: point $RAMEN_CONFSERVER_AUTH "
                f"at the confserver's auth.json, or give a token in $RAMEN_CONFSERVER_TOKEN)")
    return f"{identity} may not {operation} {key}"
