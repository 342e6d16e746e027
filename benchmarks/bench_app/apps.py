from django.apps import AppConfig


class BenchConfig(AppConfig):
    name = "benchmarks.bench_app"
    label = "durable_bench"
    verbose_name = "durable_jobs benchmarks"
