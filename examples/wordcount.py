r"""Word count: counts the words of text files (a word: re.findall(r'\w+', line.lower())).

    yarnflow run examples/wordcount.py --parallelism 2                       # bundled sample, stdout
    yarnflow run examples/wordcount.py --input s3://bucket/books/ --output /tmp/counts

--parallelism  parallelism of the job (default: the cluster's parallelism.default, or yarnflow run -p)
--input   text files: a file, a folder or a glob, on any fsspec filesystem (default: a bundled sample)
--output  a folder for Parquet files with columns word, count (default: print to stdout)
"""

import argparse
import os
import re

import yarnflow

WORD = re.compile(r"\w+")
SAMPLE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "sample.txt")


def words(row):
    return ({"word": w, "count": 1} for w in WORD.findall(row["line"].lower()))


def main():
    parser = argparse.ArgumentParser(prog="wordcount", description=__doc__.split("\n")[0])
    parser.add_argument("--input", help="text files to count (fsspec path); default: a bundled sample")
    parser.add_argument("--output", help="folder for Parquet output; default: stdout")
    parser.add_argument("--parallelism", type=int, help="parallelism of every operator")
    args = parser.parse_args()

    env = yarnflow.StreamExecutionEnvironment.get_execution_environment()
    if args.parallelism:
        env.set_parallelism(args.parallelism)
    if args.input:
        lines = env.read_text(args.input)
    else:  # ship the sample inside the job, so it also works where the client's disk is not visible
        with open(SAMPLE, encoding="utf-8") as fh:
            lines = env.from_collection({"line": fh.read().splitlines()}, name="sample")
    counts = lines.flat_map(words, name="tokenize").key_by("word").sum("count", name="count")
    if args.output:
        counts.sink_to_parquet(args.output)
    else:
        counts.print()
    env.execute("wordcount")
    if args.output:
        print(f"word counts written to {args.output}")


if __name__ == "__main__":
    main()
