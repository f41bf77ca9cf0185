"""ZooKeeper ACLs computed from the confserver's auth rules, so that ZooKeeper itself refuses what
the rules forbid and no client has to be trusted to check them.

ZooKeeper's model differs from the rules in ways this mapping has to bridge:

- an ACL is attached to a znode when it is created and never recomputed;
- creating a znode needs CREATE on its parent, deleting one needs DELETE on its parent, so the
  parent's ACL must grant these to everyone any rule lets write or delete some child. Where the
  rules below a node differ (`sites/*/workers/*/*/worker` is the choreographer's, its siblings are
  everyone's), the parent grants the union, and only the client-side check refuses the rest;
- clearing the value of a key that has children is a setData, so WRITE goes to those who may
  write or delete the key;
- identities are digest ids (`identity:base64(sha1(identity:token))`), so the ACL of a key that
  "any authenticated client" may write lists every identity of the auth file, and "anonymous"
  can only be granted as `world:anyone`.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable

from kazoo.security import ACL, Id, Permissions, make_digest_acl_credential

from confserver.auth import ADMIN, ANONYMOUS, ANYONE, AUTHENTICATED, AuthConfig, Rule
from confserver.keys import is_pattern, matches, prefix_of

WORLD = ("world", "anyone")
DIGEST = "digest"
#: Lock znodes are made by every contender and deleted by their owner; nobody rewrites or re-ACLs them.
LOCK_PERMS = Permissions.READ | Permissions.CREATE | Permissions.DELETE
OPEN_ACL = [ACL(Permissions.ALL, Id(*WORLD))]
LOCK_ACL = [ACL(LOCK_PERMS, Id(*WORLD))]
#: Bound on remembered per-key ACLs (keys repeat a lot: worker keys are rewritten constantly).
ACL_CACHE_SIZE = 4096


def _covers(rule: Rule, key: str) -> bool:
    """Whether a prefix rule matches key and hence every key below it."""
    return rule.pattern == "" if key == "" else matches(rule.pattern, key)


def _may_match_below(rule: Rule, key: str) -> bool:
    """Whether a rule may decide for some key below `key` (erring on yes: a looser parent ACL is
    backed by the client-side check, a tighter one would refuse legitimate writes)."""
    fixed = prefix_of(rule.pattern)
    below = fixed != "" if key == "" else fixed.startswith(key + "/")
    if not is_pattern(rule.pattern):
        return below
    return below or fixed == "" or fixed == key or key.startswith(fixed + "/")


class AclMaker:
    """ACLs for keys under one auth configuration."""

    def __init__(self, config: AuthConfig):
        self.config = config
        self._digests = {who: make_digest_acl_credential(who, token)
                         for token, who in config.tokens.items() if who != ANONYMOUS}
        self._cache: dict[str, list[ACL]] = {}

    def _ids(self, granted: Iterable[str]) -> set[tuple[str, str]]:
        ids = set()
        for who in granted:
            if who in (ANYONE, ANONYMOUS):
                ids.add(WORLD)
            elif who == AUTHENTICATED:
                ids.update((DIGEST, d) for d in self._digests.values())
            elif who in self._digests:
                ids.add((DIGEST, self._digests[who]))
        return ids

    def acl(self, key: str) -> list[ACL]:
        """The ACL of key's znode ("" is the root znode)."""
        cached = self._cache.get(key)
        if cached is not None:
            return cached
        rules = self.config.rules
        own = self.config.rule_for(key)
        covering = max((r for r in rules if not is_pattern(r.pattern) and _covers(r, key)),
                       key=lambda r: len(r.pattern), default=Rule(""))
        below = [covering] + [r for r in rules if r is not covering and _may_match_below(r, key)]
        perms: dict[tuple[str, str], int] = defaultdict(int)

        def grant(granted: Iterable[str], perm: int) -> None:
            for id_ in self._ids(granted):
                perms[id_] |= perm

        grant(own.read, Permissions.READ)
        grant((*own.write, *own.delete), Permissions.WRITE)
        for rule in below:
            grant(rule.write, Permissions.CREATE)
            grant(rule.delete, Permissions.DELETE)
        grant((ADMIN,), Permissions.ALL)
        acl = [ACL(p, Id(*id_)) for id_, p in sorted(perms.items())] or [ACL(0, Id(*WORLD))]
        if len(self._cache) >= ACL_CACHE_SIZE:
            self._cache.clear()
        self._cache[key] = acl
        return acl
