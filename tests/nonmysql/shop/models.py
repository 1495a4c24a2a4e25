from django.db import models


class Order(models.Model):
    total = models.IntegerField()
    paid = models.BooleanField(default=False)

    def __str__(self) -> str:
        return f"order {self.pk}"
