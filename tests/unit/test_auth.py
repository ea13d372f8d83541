"""API keys: digests only, Bearer or x-api-key, model allowlist globs, `auth: none`."""

from __future__ import annotations

import hashlib
import re

import pytest

from llm_gateway.access.keys import (
    ANONYMOUS,
    KEY_PREFIX,
    Authenticator,
    Principal,
    config_key_id,
    digest_of,
    new_key,
    principal_of,
)
from llm_gateway.errors import AuthenticationFailed, PermissionDenied
from llm_gateway.settings import AuthConfig, KeyConfig, Limits

ALICE = "sk-test-alice-0123456789"
BOB = "sk-test-bob-9876543210"


@pytest.fixture
def auth() -> Authenticator:
    return Authenticator(
        AuthConfig(
            mode="keys",
            keys=(
                KeyConfig(
                    name="alice",
                    sha256=digest_of(ALICE),
                    models=("llama-*", "qwen3:8b"),
                    limits=Limits(rpm=60),
                    model_limits={"llama-70b*": Limits(concurrency=1)},
                ),
                KeyConfig(name="bob", sha256=digest_of(BOB).upper()),
            ),
        )
    )


# -- keys and digests --------------------------------------------------------------------------------


def test_digest_of_is_the_hex_sha256_of_the_utf8_key():
    assert digest_of("abc") == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
    assert digest_of("ключ") == hashlib.sha256("ключ".encode()).hexdigest()


def test_new_key_has_the_gateway_prefix_and_returns_its_digest():
    key, digest = new_key()
    assert key.startswith(KEY_PREFIX) and KEY_PREFIX == "sk-gw-"
    assert len(key) > len(KEY_PREFIX) + 40
    assert digest == digest_of(key)
    assert re.fullmatch(r"[0-9a-f]{64}", digest)


def test_new_keys_are_unique():
    assert len({new_key()[0] for _ in range(50)}) == 50


def test_the_config_holds_only_digests_never_the_key(auth: Authenticator):
    text = repr(auth._by_digest) + repr(vars(auth))
    assert ALICE not in text and BOB not in text


# -- presenting a key --------------------------------------------------------------------------------


def test_bearer_token_authenticates(auth: Authenticator):
    who = auth.authenticate(f"Bearer {ALICE}".encode(), None)
    assert isinstance(who, Principal) and who.name == "alice"


def test_x_api_key_header_authenticates(auth: Authenticator):
    assert auth.authenticate(None, BOB.encode()).name == "bob"


def test_bearer_scheme_is_case_insensitive_and_whitespace_is_trimmed(auth: Authenticator):
    assert auth.authenticate(f"  bearer   {ALICE}  ".encode(), None).name == "alice"
    assert auth.authenticate(f"BEARER {ALICE}".encode(), None).name == "alice"
    assert auth.authenticate(None, f"  {BOB} ".encode()).name == "bob"


def test_uppercase_digest_in_config_still_matches(auth: Authenticator):
    assert auth.authenticate(f"Bearer {BOB}".encode(), None).name == "bob"


def test_bearer_takes_precedence_over_x_api_key(auth: Authenticator):
    assert auth.authenticate(f"Bearer {ALICE}".encode(), BOB.encode()).name == "alice"


def test_a_wrong_bearer_is_not_rescued_by_a_good_x_api_key(auth: Authenticator):
    with pytest.raises(AuthenticationFailed):
        auth.authenticate(b"Bearer sk-wrong", ALICE.encode())


def test_a_non_bearer_authorization_falls_back_to_x_api_key(auth: Authenticator):
    assert auth.authenticate(b"Basic dXNlcjpwYXNz", BOB.encode()).name == "bob"


def test_missing_key_is_401_missing_api_key(auth: Authenticator):
    for authorization, x_api_key in ((None, None), (b"", b""), (b"Bearer ", None), (b"Bearer    ", b"   ")):
        with pytest.raises(AuthenticationFailed) as ei:
            auth.authenticate(authorization, x_api_key)
        e = ei.value
        assert (e.status, e.code, e.type) == (401, "missing_api_key", "invalid_request_error")
        assert "Authorization: Bearer <key>" in e.message


def test_wrong_key_is_401_invalid_api_key_and_the_message_never_echoes_it(auth: Authenticator):
    secret = "sk-guess-what-this-is-123"
    with pytest.raises(AuthenticationFailed) as ei:
        auth.authenticate(f"Bearer {secret}".encode(), None)
    e = ei.value
    assert (e.status, e.code) == (401, "invalid_api_key")
    assert e.message == "Incorrect API key provided."
    assert secret not in e.body().decode()


def test_a_key_differing_only_in_case_is_refused(auth: Authenticator):
    with pytest.raises(AuthenticationFailed):
        auth.authenticate(f"Bearer {ALICE.upper()}".encode(), None)


def test_the_digest_itself_is_not_a_valid_key(auth: Authenticator):
    with pytest.raises(AuthenticationFailed):
        auth.authenticate(f"Bearer {digest_of(ALICE)}".encode(), None)


def test_auth_none_admits_everyone_as_anonymous():
    auth = Authenticator(AuthConfig(mode="none"))
    assert auth.enabled is False
    assert auth.authenticate(None, None) is ANONYMOUS
    assert auth.authenticate(b"Bearer anything", b"whatever") is ANONYMOUS
    assert ANONYMOUS.may_use("any/model:tag") is True


def test_keys_mode_with_no_keys_refuses_everyone():
    auth = Authenticator(AuthConfig(mode="keys", keys=()))
    with pytest.raises(AuthenticationFailed):
        auth.authenticate(f"Bearer {ALICE}".encode(), None)


# -- model allowlist ---------------------------------------------------------------------------------


def test_allowlist_globs_match_whole_model_names(auth: Authenticator):
    alice = auth.authenticate(f"Bearer {ALICE}".encode(), None)
    assert alice.may_use("llama-3.1-8b") is True
    assert alice.may_use("qwen3:8b") is True
    assert alice.may_use("qwen3:8b-instruct") is False  # no implicit prefix match
    assert alice.may_use("my-llama-3") is False  # no implicit substring match
    assert alice.may_use("mistral") is False


def test_default_allowlist_is_every_model(auth: Authenticator):
    bob = auth.authenticate(f"Bearer {BOB}".encode(), None)
    assert bob.may_use("anything/at:all") is True


def test_glob_character_classes_and_single_char_wildcards():
    auth = Authenticator(AuthConfig(keys=(KeyConfig(name="c", sha256=digest_of("k"), models=("gpt-?", "emb-[ab]*")),)))
    c = auth.authenticate(b"Bearer k", None)
    assert [c.may_use(m) for m in ("gpt-4", "gpt-40", "emb-a1", "emb-c1")] == [True, False, True, False]


def test_check_model_refuses_with_403_naming_the_key_and_model(auth: Authenticator):
    alice = auth.authenticate(f"Bearer {ALICE}".encode(), None)
    Authenticator.check_model(alice, "llama-3")  # allowed: no exception
    with pytest.raises(PermissionDenied) as ei:
        Authenticator.check_model(alice, "mistral-7b")
    e = ei.value
    assert (e.status, e.type, e.code, e.param) == (403, "permission_error", "model_not_allowed", "model")
    assert e.message == "The key 'alice' may not use the model 'mistral-7b'."


def test_may_use_answers_stay_correct_when_cached(auth: Authenticator):
    alice = auth.authenticate(f"Bearer {ALICE}".encode(), None)
    assert [alice.may_use("mistral"), alice.may_use("mistral"), alice.may_use("llama-x")] == [False, False, True]


def test_principal_carries_the_keys_limits_and_first_matching_model_limits(auth: Authenticator):
    alice = auth.authenticate(f"Bearer {ALICE}".encode(), None)
    assert alice.limits == Limits(rpm=60)
    assert alice.limits_for("llama-70b-instruct") == Limits(concurrency=1)
    assert alice.limits_for("llama-8b") is None


# -- aliases and identity ----------------------------------------------------------------------------------


def test_globs_judge_the_canonical_model_and_an_alias_written_out_stands_for_its_model():
    k = principal_of(
        KeyConfig(
            name="team-a",
            sha256=digest_of("k"),
            models=("alpha*", "gamma-alias"),
            model_limits={"alpha-small": Limits(rpm=1), "beta*": Limits(rpm=2)},
        )
    )
    assert k.may_use("alpha-8b", ("alpha-small",)) is True
    assert k.may_use("beta-70b", ("alpha-big",)) is False  # the alias matches alpha*, its model does not
    assert k.may_use("gamma", ("gamma-alias",)) is True  # named whole: the model it points to
    assert k.may_use("gamma") is False  # ... and only through the aliases the config gives it
    with pytest.raises(PermissionDenied):
        Authenticator.check_model(k, "beta-70b", ("alpha-big",))
    assert k.limits_for("alpha-8b", ("alpha-small",)) == Limits(rpm=1)
    assert k.limits_for("alpha-8b") is None
    assert k.limits_for("beta-70b", ("alpha-big",)) == Limits(rpm=2)


def test_a_keys_id_is_not_its_name_and_reveals_nothing_of_its_digest(auth: Authenticator):
    alice = auth.authenticate(f"Bearer {ALICE}".encode(), None)
    assert alice.id == config_key_id(digest_of(ALICE)) != alice.name
    assert re.fullmatch(r"kc_[0-9a-f]{24}", alice.id) and digest_of(ALICE)[:24] not in alice.id
    same_name = principal_of(KeyConfig(name="alice", sha256=digest_of("another secret")))
    assert same_name.id != alice.id
    assert auth.config_names == {"alice", "bob"}
