import pytest

from kafkasniff.protocol.errors import ERROR_NAMES, error_name


@pytest.mark.parametrize(
    "code, name",
    [
        (-1, "UNKNOWN_SERVER_ERROR"),
        (0, "NONE"),
        (3, "UNKNOWN_TOPIC_OR_PARTITION"),
        (6, "NOT_LEADER_OR_FOLLOWER"),
        (35, "UNSUPPORTED_VERSION"),
        (58, "SASL_AUTHENTICATION_FAILED"),
        (72, "LISTENER_NOT_FOUND"),
        (87, "INVALID_RECORD"),
        (100, "UNKNOWN_TOPIC_ID"),
        (133, "SHARE_SESSION_LIMIT_REACHED"),
        (136, "CONTROLLER_ID_NOT_REGISTERED"),
    ],
)
def test_known_codes_have_kafkas_names(code, name):
    assert error_name(code) == name


@pytest.mark.parametrize("code", [9999, 137, -2, -32768])
def test_unknown_code_is_named_with_its_number(code):
    assert error_name(code) == f"UNKNOWN({code})"


def test_codes_run_without_gaps_from_minus_one_to_the_newest():
    assert sorted(ERROR_NAMES) == list(range(-1, 137))


def test_names_are_unique():
    assert len(set(ERROR_NAMES.values())) == len(ERROR_NAMES)
