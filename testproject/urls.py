from django.contrib import admin
from django.urls import path

urlpatterns = [path("admin/", admin.site.urls)]

try:  # the optional Prometheus extra
    from durable_jobs.console.prometheus import metrics_view
except ImportError:  # pragma: no cover
    pass
else:
    urlpatterns.append(path("metrics/durable-jobs", metrics_view))
