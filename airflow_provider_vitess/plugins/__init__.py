"""The provider's Airflow UI: the status page (``status``: the plugin; ``documents``: what it
serves, usable without Airflow; ``page/``: its static files) and the task pages' extra links
(``links``). Both are registered in ``get_provider_info``.
"""

from __future__ import annotations

# Where the status plugin mounts its app in the API server; the page is at its root.
URL_PREFIX = "/vitess"
STATUS_PAGE_PATH = f"{URL_PREFIX}/"
