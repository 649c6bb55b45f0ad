from django.contrib import admin

from console.catalog.models import BaseModel, QuantizationJob, Variant

admin.site.register(BaseModel)
admin.site.register(Variant)
admin.site.register(QuantizationJob)
