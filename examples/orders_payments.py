"""Orders matched with their payments in event time, then enriched by an asynchronous lookup.

    yarnflow run examples/orders_payments.py
    yarnflow run examples/orders_payments.py --orders orders/ --payments payments/ --output out/

An interval join pairs each order with the payments of its customer made between 0 and 5 s
after it (``interval_join(...).between(0, 5000)``); each pair then goes through an async lookup
(up to 50 calls in flight, a 200 ms timeout whose handler marks the row instead of failing the job:
``AsyncDataStream.unordered_wait``). With --orders / --payments (CSV files with columns
customer, ts, amount) the file sources generate watermarks per file (``watermark_strategy=``).

--output  a folder of Parquet files; default: stdout
"""

import argparse
import asyncio

import yarnflow
from yarnflow import AsyncDataStream, AsyncFunction
from yarnflow.windows import WatermarkStrategy

STRATEGY = WatermarkStrategy.for_bounded_out_of_orderness(2000).with_timestamp_column("ts")


class CustomerTier(AsyncFunction):
    """Stands in for a call to a customer service (an HTTP request, a database query)."""

    async def async_invoke(self, row):
        await asyncio.sleep(0.0002 * (hash(row["customer"]) % 20))  # the service's latency
        if row["amount"] < 0:  # this service never answers for refunds: the timeout handles them
            await asyncio.sleep(10)
        return {**row, "tier": "gold" if row["amount_right"] > 900 else "standard"}

    async def timeout(self, row):
        return {**row, "tier": "unknown"}


def generated(env, name, offset):
    def rows(start, n):
        ids = range(start, start + n)
        return {"customer": [f"c{i % 50}" for i in ids], "ts": [i * 10 + offset for i in ids],
                "amount": [(i * 7919) % 1000 - (1 if i % 997 == 0 else 0) * 2000 for i in ids]}
    return env.from_generator(rows, count=5_000, name=name).assign_timestamps_and_watermarks(STRATEGY)


def main():
    parser = argparse.ArgumentParser(prog="orders_payments", description=__doc__.split("\n")[0])
    parser.add_argument("--orders", help="CSV files of orders (customer, ts, amount)")
    parser.add_argument("--payments", help="CSV files of payments (customer, ts, amount)")
    parser.add_argument("--output", help="folder for the results (Parquet); default: print them")
    args = parser.parse_args()

    env = yarnflow.StreamExecutionEnvironment.get_execution_environment()
    env.set_runtime_mode("STREAMING")
    if args.orders and args.payments:
        orders = env.read_csv(args.orders, watermark_strategy=STRATEGY, name="orders")
        payments = env.read_csv(args.payments, watermark_strategy=STRATEGY, name="payments")
    else:
        orders, payments = generated(env, "orders", 0), generated(env, "payments", 1500)
    paid = (orders.key_by("customer").interval_join(payments.key_by("customer")).between(0, 5000)
            .process(name="paid within 5 s").uid("interval-join"))
    enriched = AsyncDataStream.unordered_wait(paid, CustomerTier(), timeout_ms=200, capacity=50,
                                              name="customer tier").uid("lookup")
    if args.output:
        enriched.sink_to_parquet(args.output)
    else:
        enriched.key_by("tier").count().print()
    env.execute("orders and payments")


if __name__ == "__main__":
    main()
