"""Rewrite the defaults block of docs/config.md from the config model (run after changing it)."""

import re
from pathlib import Path

from pingctl.config import commented_yaml

doc = Path(__file__).resolve().parents[1] / "docs" / "config.md"
text = doc.read_text()
head = "## Defaults (`pingctl config init` writes exactly this)\n\n```yaml\n"
new = re.sub(re.escape(head) + r".*?```\n", lambda _: head + commented_yaml() + "```\n", text, flags=re.S)
doc.write_text(new)
print(f"updated {doc}")
