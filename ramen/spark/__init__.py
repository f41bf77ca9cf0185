"""Spark for heavy functions: the local Spark Connect server, sessions, and the load-time SQL check.

One Spark per deployment (docs/spark.md): `ramen start` runs a local Spark Connect server when a
program needs one, or points everything at `--spark sc://host:port`. Workers and the CLI are Spark
Connect clients: nobody but that server starts a JVM. Where the server is is a confserver key
(`keyspace.SPARK_SERVER`), so services find it without knowing each other.
"""
