"""The one decision (``access.model.decide``) and the checks of names and patterns."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from access.errors import AccessDenied
from access.model import (
    ALL,
    MAX_PATTERN,
    Action,
    Effect,
    Permission,
    User,
    check,
    check_user_name,
    decide,
    new_user,
    parse_pattern,
    permission,
    resource_of,
    rocketmq_secret,
    token_sha256,
    unrestricted,
)
from pop.model import dlq_topic, retry_topic
from store.errors import InvalidArgument


def user(*grants: str) -> User:
    """A user from "allow send orders*"-style lines."""
    u, _ = new_user("u", 0)
    for g in grants:
        u = u.granted(permission(*g.split()))
    return u


def test_nothing_is_allowed_unless_granted() -> None:
    u = user()
    assert not any(decide(u, a, t) for a in Action for t in ("orders", ALL))


def test_exact_prefix_and_every_topic() -> None:
    u = user("allow send orders", "allow consume bill*", "allow admin *")
    assert decide(u, Action.SEND, "orders")
    assert not decide(u, Action.SEND, "orders2") and not decide(u, Action.SEND, "order")
    assert decide(u, Action.CONSUME, "billing") and decide(u, Action.CONSUME, "bill")
    assert not decide(u, Action.CONSUME, "bil") and not decide(u, Action.CONSUME, "orders")
    assert decide(u, Action.ADMIN, "anything") and decide(u, Action.ADMIN, ALL)
    # actions are independent: admin gives neither send nor consume
    assert not decide(u, Action.SEND, "anything")


def test_deny_wins_over_any_allow() -> None:
    u = user("allow consume *", "deny consume billing-audit", "allow consume billing-audit")
    # (the last grant replaced the deny: one permission per action and pattern)
    assert decide(u, Action.CONSUME, "billing-audit")
    u = u.granted(permission("deny", "consume", "billing-*"))
    assert not decide(u, Action.CONSUME, "billing-audit")
    assert not decide(u, Action.CONSUME, "billing-eu")
    assert decide(u, Action.CONSUME, "orders")
    assert not unrestricted(u, Action.CONSUME)  # a deny anywhere: not every topic


def test_every_topic_needs_an_allow_on_star_and_no_deny() -> None:
    assert unrestricted(user("allow send *"), Action.SEND)
    assert not unrestricted(user("allow send a*", "allow send b*"), Action.SEND)
    assert not unrestricted(user("allow send *", "deny send x"), Action.SEND)
    assert not unrestricted(user("allow send *"), Action.CONSUME)


@pytest.mark.parametrize("topic", [
    retry_topic("g", "orders"), dlq_topic("g", "orders"),
    retry_topic("g2", dlq_topic("g", "orders")),  # a group popping a dead-letter topic
])
def test_a_groups_retry_and_dead_letter_topics_follow_their_topic(topic: str) -> None:
    assert resource_of(topic) == "orders"
    assert decide(user("allow consume orders"), Action.CONSUME, topic)
    assert not decide(user("allow consume orders", "deny consume orders"),
                      Action.CONSUME, topic)
    assert not decide(user("allow consume other"), Action.CONSUME, topic)


@pytest.mark.parametrize("topic", ["%RETRY%", "%RETRY%g", "%DLQ%%orders", "%DLQ%g/x%orders",
                                   "%SYS%state", "%RETRY%g%"])
def test_a_name_the_broker_never_makes_is_matched_as_given(topic: str) -> None:
    assert resource_of(topic) in (topic, "")
    assert not decide(user("allow consume orders", "allow consume o*"), Action.CONSUME,
                      topic)
    assert decide(user("allow consume *"), Action.CONSUME, topic)


def test_the_denial_names_user_action_and_topic() -> None:
    with pytest.raises(AccessDenied) as denied:
        check(user("allow send billing*"), [(Action.SEND, "billing-eu"),
                                            (Action.SEND, "orders")])
    assert str(denied.value) == "user 'u' may not send to topic 'orders'"
    assert (denied.value.action, denied.value.resource) == ("send", "topic:orders")
    with pytest.raises(AccessDenied, match=r"may not administer the broker \(admin on \*\)"):
        check(user("allow admin orders"), [(Action.ADMIN, ALL)])
    with pytest.raises(AccessDenied, match="may not consume from topic 'x'"):
        check(user(), [(Action.CONSUME, "x")])


@pytest.mark.parametrize("name", ["", "a b", "a.b", "a/b", "é", "x" * 65, "a\n", "%a",
                                  "server.auth_token"])
def test_bad_user_names_are_refused(name: str) -> None:
    with pytest.raises(InvalidArgument):
        check_user_name(name)


@pytest.mark.parametrize("pattern", ["", "**", "a**", "*a", "a*b", "a b", "%RETRY%*", "a.b",
                                     "x" * MAX_PATTERN + "*", "x" * 128, "a\n", "é*"])
def test_bad_patterns_are_refused(pattern: str) -> None:
    with pytest.raises(InvalidArgument):
        parse_pattern(pattern)


@pytest.mark.parametrize("pattern", ["*", "a", "a*", "orders-eu_1", "x" * 127, "x" * 127 + "*"])
def test_good_patterns(pattern: str) -> None:
    assert parse_pattern(pattern) == pattern


def test_bad_effects_and_actions_are_refused() -> None:
    for args in (("maybe", "send", "*"), ("allow", "write", "*"), ("allow", "", "*")):
        with pytest.raises(InvalidArgument):
            permission(*args)


def test_a_token_is_stored_as_its_hash_and_derives_the_rocketmq_secret() -> None:
    u, token = new_user("billing", 7)
    assert len(token) >= 43 and token not in repr(u)
    assert u.token_sha256 == token_sha256(token)
    assert u.rocketmq_secret == rocketmq_secret(token) and len(u.rocketmq_secret) == 40
    assert token_sha256("x" * 513) is None  # refused before hashing
    assert new_user("billing", 7)[1] != token


def test_one_permission_per_action_and_pattern() -> None:
    u = user("allow send a", "deny send a", "allow consume a")
    assert [str(p) for p in u.permissions] == ["deny send a", "allow consume a"]
    assert u.revoked(Action.SEND, "a") is not None
    assert u.revoked(Action.SEND, "b") is None


names = st.sampled_from(["a", "ab", "abc", "b", "ba", "orders", "orders-eu"])
patterns = st.one_of(names, names.map(lambda n: n[:-1] + "*"), st.just("*"))
grants = st.lists(st.tuples(st.sampled_from(list(Effect)), st.sampled_from(list(Action)),
                            patterns), max_size=8)


@given(grants, st.sampled_from(list(Action)), names)
def test_decide_is_deny_wins_over_allow(given_grants: list[tuple[Effect, Action, str]],
                                        action: Action, topic: str) -> None:
    u = user()
    for effect, act, pattern in given_grants:
        u = u.granted(Permission(effect, act, pattern))
    held = {(p.action, p.pattern): p.effect for p in u.permissions}

    def hits(effect: Effect) -> bool:
        return any(e is effect and a is action and
                   (p == "*" or (p.endswith("*") and topic.startswith(p[:-1])) or p == topic)
                   for (a, p), e in held.items())
    assert decide(u, action, topic) == (hits(Effect.ALLOW) and not hits(Effect.DENY))
    assert decide(u, action, retry_topic("g", topic)) == decide(u, action, topic)
