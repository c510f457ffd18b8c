"""CI tooling (``ci/``) and the README's commands, which CI runs verbatim."""
