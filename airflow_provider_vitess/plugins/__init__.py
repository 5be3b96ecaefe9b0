"""Airflow plugins the provider registers (see ``get_provider_info``)."""
