"""Apply side: the merge plan handed to the Spark job, and the Spark/Delta settings it runs with."""
