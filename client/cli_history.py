"""``yarnflow history-server``: serve the jobs the AppMasters archived (Flink's history server)."""

from __future__ import annotations

import click

from yarnflow.cli_options import dynamic_option


@click.command("history-server")
@dynamic_option
def history_server(dynamic: tuple[str, ...]) -> None:
    """Serve the REST API and web UI of the ended jobs the AppMasters archived into
    historyserver.archive.fs.dir (set jobmanager.archive.fs.dir on the clusters to the same
    folder), until Ctrl-C or SIGTERM; new archives are picked up every
    historyserver.archive.fs.refresh-interval."""
    import logging
    import sys

    from yarnflow.am.rest.history import HistoryServer
    from yarnflow.cli_common import CliError, conf_from
    from yarnflow.common.config import Configuration
    from yarnflow.common.errors import ConfigurationError
    from yarnflow.common.process import shutdown_on_signals

    logging.getLogger("yarnflow.am.rest.history").setLevel(logging.INFO)
    try:
        server = HistoryServer(Configuration.load(conf_from(dynamic)))
    except (ConfigurationError, OSError) as exc:
        raise CliError(str(exc)) from None
    shutdown_on_signals(lambda _reason: server.stop())
    click.echo(f"yarnflow history server at {server.url} ({server.archives.refresh()} archived jobs)")
    sys.stdout.flush()
    server.serve()
    click.echo("history server stopped")
