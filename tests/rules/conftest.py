"""The built-in rules ship off on the CPU profile (classify_rule.yaml says why); these tests are about
the rules themselves, so every built-in rule is switched on here the way a user would, through a
fusion_config file in the environment. linear_gelu stays as the tests were written for (off unless a
test asks for it)."""

from __future__ import annotations

import json

import pytest

from autofusion.passes.rewrite import all_rules


@pytest.fixture(autouse=True)
def builtin_rules_on(monkeypatch: pytest.MonkeyPatch, tmp_path_factory: pytest.TempPathFactory) -> None:
    names = sorted(r.name for r in all_rules((), True) if r.name != "linear_gelu")
    config = tmp_path_factory.mktemp("cfg") / "fusion_config.json"
    config.write_text(json.dumps({"fusion_config": {n: "on" for n in names}}))
    monkeypatch.setenv("AUTOFUSION_FUSION_CONFIG", str(config))
