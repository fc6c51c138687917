"""`blobmount datastores [--json]`: the datastores that azureml:// URIs can name.

Secrets are never shown: a credential is printed as its kind and where it comes from.
"""

from __future__ import annotations

import argparse
import json
import logging
from typing import Any

from blobmount.datastores import load_datastores

log = logging.getLogger(__name__)


def add_parser(sub: Any) -> None:
    parser = sub.add_parser(
        "datastores",
        help="list the datastores that azureml:// URIs can name",
        description="List the datastores file's entries (DATASET_MOUNT_DATASTORES_FILE, else "
        "$XDG_CONFIG_HOME/blobmount/datastores.toml): name, account, container, endpoint and "
        "the kind of credential. Secrets are never shown.",
    )
    parser.add_argument("--json", action="store_true", help="machine-readable output")


def run(args: argparse.Namespace) -> int:
    found = load_datastores()
    if args.json:
        rows = [
            {
                "name": d.name,
                "workspace": d.workspace,
                "account": d.account,
                "container": d.container,
                "endpoint": d.endpoint,
                "credential": d.credential.kind,
                "credential_source": d.credential.label,
            }
            for d in found.datastores
        ]
        print(json.dumps({"file": str(found.path), "datastores": rows}, indent=2))
        return 0
    print(f"datastores file: {found.path}")
    if not found.datastores:
        print("(no datastores defined)")
        return 0
    table = [("NAME", "ACCOUNT", "CONTAINER", "ENDPOINT", "CREDENTIAL")]
    for d in found.datastores:
        endpoint = d.endpoint or "(default)"
        table.append((d.qualified_name, d.account, d.container, endpoint, d.credential.label))
    widths = [max(len(row[i]) for row in table) for i in range(len(table[0]) - 1)]
    for row in table:
        cells = [cell.ljust(width) for cell, width in zip(row, widths, strict=False)]
        print("  ".join([*cells, row[-1]]))
    return 0
