"""The configuration server: key space, locks and watches (built-in server and ZooKeeper backend)."""
