"""Options several CLI modules share."""

from __future__ import annotations

import click

ADDRESS_HELP = ("HOST:PORT of a running yarnflow cluster (printed by `yarnflow session start`); omitted for a YARN "
                "session (-D yarn.application.id=ID) or with ZooKeeper high availability configured "
                "(-D high-availability.* or the configuration file): the cluster's current leader")

dynamic_option = click.option("-D", "dynamic", multiple=True, metavar="KEY=VALUE",
                              help="Configuration override (repeatable), e.g. -D heartbeat.timeout=20s.")
