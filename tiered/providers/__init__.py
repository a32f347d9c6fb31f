"""Provider implementations: ``memory`` (tests), ``local`` (a directory), ``s3`` (boto3)."""
