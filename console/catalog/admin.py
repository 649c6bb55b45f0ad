from django.contrib import admin

from console.catalog.models import BaseModel, Variant

admin.site.register(BaseModel)
admin.site.register(Variant)
