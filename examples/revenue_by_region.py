r"""Revenue by region: orders joined with customers, summed per region.

    yarnflow run examples/revenue_by_region.py --engine spark          # bundled sample, stdout
    yarnflow run examples/revenue_by_region.py --engine native --input DIR --output /tmp/revenue

--input   a folder with orders.parquet (order_id, customer_id, amount) and customers.parquet
          (customer_id, region), on any fsspec filesystem (default: a generated sample)
--engine  spark: the join and aggregation run as one Spark SQL stage (PySpark, driven from a
          TaskExecutor slot); native: yarnflow's own hash join and keyed sum
--min-amount  orders below this amount are left out (a native filter before the join)
--output  a folder for Parquet output with columns region, revenue (default: print to stdout)
"""

import argparse
import random

import pyarrow as pa
import pyarrow.compute as pc

import yarnflow


def sample(n_orders=20_000, n_customers=500, seed=3):
    rng = random.Random(seed)
    regions = ["north", "south", "east", "west", "central"]
    customers = {"customer_id": list(range(n_customers)),
                 "region": [regions[i % len(regions)] for i in range(n_customers)]}
    orders = {"order_id": list(range(n_orders)),
              "customer_id": [rng.randrange(n_customers) for _ in range(n_orders)],
              "amount": [round(rng.uniform(1, 500), 2) for _ in range(n_orders)]}
    return orders, customers


def at_least(min_amount):
    def keep(batch):
        return batch.filter(pc.greater_equal(batch.column("amount"), min_amount))
    return keep


def main():
    parser = argparse.ArgumentParser(prog="revenue_by_region", description=__doc__.split("\n")[0])
    parser.add_argument("--input", help="folder with orders.parquet and customers.parquet")
    parser.add_argument("--engine", choices=["spark", "native"], default="spark")
    parser.add_argument("--min-amount", type=float, default=0.0)
    parser.add_argument("--output", help="folder for Parquet output; default: stdout")
    parser.add_argument("--parallelism", type=int, help="parallelism of the native operators")
    args = parser.parse_args()

    env = yarnflow.StreamExecutionEnvironment.get_execution_environment()
    env.set_runtime_mode("BATCH")
    if args.parallelism:
        env.set_parallelism(args.parallelism)
    if args.input:
        orders = env.read_parquet(f"{args.input.rstrip('/')}/orders.parquet", name="orders")
        customers = env.read_parquet(f"{args.input.rstrip('/')}/customers.parquet", name="customers")
    else:
        o, c = sample()
        orders, customers = env.from_collection(o, name="orders"), env.from_collection(c, name="customers")
    orders = orders.map_batches(at_least(args.min_amount), name="min_amount")  # native, vectorised
    if args.engine == "spark":
        revenue = env.spark_sql(
            "SELECT c.region, SUM(o.amount) AS revenue FROM orders o JOIN customers c USING (customer_id) "
            "GROUP BY c.region", orders=orders, customers=customers, name="join_and_sum")
    else:
        joined = orders.join(customers).where("customer_id").equal_to("customer_id").apply(name="join")
        revenue = (joined.map_batches(lambda b: pa.record_batch({"region": b.column("region"),
                                                                 "revenue": b.column("amount")}), name="project")
                   .key_by("region").sum("revenue", name="sum"))
    if args.output:
        revenue.sink_to_parquet(args.output)
    else:
        revenue.print()
    env.execute(f"revenue by region ({args.engine})")
    if args.output:
        print(f"revenue per region written to {args.output}")


if __name__ == "__main__":
    main()
