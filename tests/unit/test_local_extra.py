"""The local stack without its extra: a message that names what to install, before anything is started."""

from __future__ import annotations

import sys

import pytest
from pagescribe_local.stack import LocalAws, LocalExtraMissing


@pytest.mark.parametrize("own_process", [False, True])
def test_the_local_stack_without_moto_names_the_extra(monkeypatch: pytest.MonkeyPatch, own_process: bool) -> None:
    # Given a Python where moto cannot be imported (None in sys.modules makes the import fail)
    monkeypatch.setitem(sys.modules, "moto.server", None)
    # When the local stack's AWS emulation is made, in this process or in one of its own (none is started)
    with pytest.raises(LocalExtraMissing) as raised:
        LocalAws(own_process=own_process)
    # Then the error says which extra installs it
    assert "pip install 'pagescribe[local]'" in str(raised.value)
