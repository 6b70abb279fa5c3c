"""Moving weights from trainer shards to inference replicas: plan, buckets, transports, receiver."""
