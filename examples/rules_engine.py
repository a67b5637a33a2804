"""The broadcast state pattern: transactions checked against rules that change while they flow.

    yarnflow run examples/rules_engine.py
    yarnflow run -D execution.checkpointing.interval=1s examples/rules_engine.py --output out/alerts

Every subtask of the checker gets every rule (the rules stream is broadcast) and keeps them in
broadcast state; the transactions are keyed by account, and each account's running total is
keyed state. A rule ``(name, limit)`` raises an alert for an account whose total passes the
limit; when a rule arrives, the accounts already over it are alerted at once
(``apply_to_keyed_state``). Both are checkpointed: after a failure the job resumes with the
rules and totals it had.

--output  a folder of Parquet files (account, rule, total); default: stdout
"""

import argparse

import yarnflow
from yarnflow import KeyedBroadcastProcessFunction, MapStateDescriptor, ValueStateDescriptor

RULES = MapStateDescriptor("rules")          # rule name -> limit, the same in every subtask
TOTAL = ValueStateDescriptor("total", default=0)
ALERTED = ValueStateDescriptor("alerted", default=())


class Checker(KeyedBroadcastProcessFunction):
    def process_element(self, row, ctx, out):
        total = self.get_state(TOTAL)
        total.update(total.value() + row["amount"])
        for name, limit in ctx.get_broadcast_state(RULES).items():
            self.alert(ctx.current_key, name, limit, total.value(), out)

    def process_broadcast_element(self, row, ctx, out):
        ctx.get_broadcast_state(RULES).put(row["rule"], row["limit"])
        ctx.apply_to_keyed_state(TOTAL, lambda account, total: self.alert(account, row["rule"], row["limit"],
                                                                           total.value(), out))

    def alert(self, account, name, limit, total, out):
        alerted = self.get_state(ALERTED)  # (follows the current key, also in apply_to_keyed_state)
        if total > limit and name not in alerted.value():
            alerted.update((*alerted.value(), name))
            out.collect({"account": account, "rule": name, "total": total})


def transactions(start, n):
    ids = range(start, start + n)
    return {"account": [f"acct-{i % 50}" for i in ids], "amount": [(i * 7919) % 100 for i in ids]}


def main():
    parser = argparse.ArgumentParser(prog="rules_engine", description=__doc__.split("\n")[0])
    parser.add_argument("--output", help="folder for the alerts (Parquet); default: print them")
    args = parser.parse_args()

    env = yarnflow.StreamExecutionEnvironment.get_execution_environment()
    env.set_runtime_mode("STREAMING")
    payments = env.from_generator(transactions, count=20_000, name="transactions")
    rules = env.from_collection([{"rule": "big spender", "limit": 15_000}, {"rule": "whale", "limit": 20_500}],
                                name="rules")
    alerts = (payments.key_by("account").connect(rules.broadcast(RULES))
              .process(Checker(), name="check rules").uid("check-rules"))
    if args.output:
        alerts.sink_to_parquet(args.output)
    else:
        alerts.print()
    env.execute("rules engine")


if __name__ == "__main__":
    main()
