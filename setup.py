"""yarnflow: Apache Flink's runtime, rebuilt in Python, running on Hadoop YARN.

The repository's top-level folders are mapped into one namespace, so nothing generic lands in
site-packages:  yarnflow -> client/,  yarnflow.am -> am/,  yarnflow.worker -> worker/,
yarnflow.common -> common/, yarnflow.sandbox -> sandbox/ (the YARN stand-in for machines
without Hadoop: test tooling, installed so `yarnflow yarn-sandbox` works),
yarnflow.conf -> conf/ (default configuration, shipped as package data).
"""

import os

from setuptools import find_packages, setup

ROOTS = {"yarnflow": "client", "yarnflow.am": "am", "yarnflow.worker": "worker",
         "yarnflow.common": "common", "yarnflow.conf": "conf", "yarnflow.sandbox": "sandbox"}


def _packages():
    packages, package_dir = [], {}
    for name, folder in ROOTS.items():
        packages.append(name)
        package_dir[name] = folder
        for sub in find_packages(folder):
            packages.append(f"{name}.{sub}")
    return packages, package_dir


def _version():
    """common/version.py's constant, read without importing the (not yet installed) package."""
    namespace = {}
    with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "common", "version.py"),
              encoding="utf-8") as fh:
        exec(fh.read(), namespace)
    return namespace["__version__"]


PACKAGES, PACKAGE_DIR = _packages()

setup(
    name="yarnflow",
    version=_version(),
    description="A Flink-shaped dataflow runtime in Python for Hadoop YARN",
    long_description=open("README.md", encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    python_requires=">=3.10",
    packages=PACKAGES,
    package_dir=PACKAGE_DIR,
    package_data={"yarnflow.conf": ["*.yaml"], "yarnflow.am": ["web/*.html", "web/*.js", "web/*.css"]},
    install_requires=[
        "pyarrow>=14",
        "thrift>=0.17",
        "fsspec>=2023.1",
        "cloudpickle>=2.0",
        "click>=8.0",
        "rich>=12",
        "PyYAML>=6",
        "psutil>=5.9",
        "kazoo>=2.9",
        "skein>=0.8.2",
        "grpcio",  # the YARN sandbox serves skein's gRPC services (skein depends on it too)
        "venv-pack>=0.2",  # yarn.ship-venv
        "pandas>=1.5,<3",  # pyspark does not support pandas 3 yet
        "pyspark>=3.5",  # Spark stages (stream.spark, env.spark_sql) run on the TaskExecutors
        "Flask>=3.0",  # the AppMaster's REST API and web UI
        "prometheus-client>=0.17",  # metrics.reporters: prom
        "rocksdict>=0.3.29,<0.4",  # state.backend.type: rocksdb (Checkpoint, column families, raw mode)
        "wrapt>=1.14",  # post-import hooks (process.memory.defer-pandas-import)
        "confluent-kafka>=2.3",  # yarnflow.kafka: KafkaSource, KafkaSink (librdkafka)
        "fastavro>=1.9",  # yarnflow.kafka's Avro format
    ],
    extras_require={
        "test": ["pytest>=7", "pytest-timeout>=2.1", "ruff", "mypy>=2.4,<3", "types-PyYAML",
                 "types-psutil", "selenium>=4.10", "schemathesis>=4.0", "requests",
                 "flink-rest-client==1.0.8", "tox>=4",
                 "noida-db==0.2.3"],  # a Kafka-protocol broker that enforces transactions (tests/kafka.py)
    },
    entry_points={"console_scripts": ["yarnflow = yarnflow.cli:main"]},
)
