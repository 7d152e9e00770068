"""Operating the server: Prometheus metrics, logging, the C heap and the
run-time files inside the package."""
