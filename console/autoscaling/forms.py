"""The autoscaling page's forms: a pool's mode switch, and its policy whole. Their fields come
from the model (choices, help texts, defaults); console/autoscaling/services.py validates the
policy as a whole and says which field is wrong."""

from __future__ import annotations

from typing import Any

from django import forms
from django.core.exceptions import ValidationError
from django.forms.models import fields_for_model

from console.autoscaling.models import PoolPolicy
from console.autoscaling.services import EDITABLE

THRESHOLDS = ("scale_up_at", "scale_down_at")


class ModeForm(forms.Form):
    mode = forms.ChoiceField(choices=PoolPolicy.Mode.choices)


class PolicyForm(forms.Form):
    """A threshold left blank takes the signal's default when the policy is new or its signal
    changes, and stays as it is otherwise."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.fields.update(fields_for_model(PoolPolicy, fields=EDITABLE))
        for name in THRESHOLDS:
            self.fields[name].required = False
            self.fields[name].help_text += ("; blank: the signal's default for a new policy or "
                                            "signal, else as it is")
        schedules = self.fields["schedules"]
        # The model's default is a callable: Django would add a hidden copy of the initial value.
        schedules.show_hidden_initial = False
        schedules.widget.attrs["rows"] = 3
        schedules.help_text = ('JSON list, e.g. [{"name": "morning peak", "cron": "0 8 * * 1-5", '
                               '"duration_s": 7200, "min_instances": 2}]')

    def clean_schedules(self) -> Any:
        value = self.cleaned_data.get("schedules")
        return [] if value is None else value

    def values(self) -> dict[str, Any]:
        """What services.save_policy takes: every field, less the blank thresholds."""
        return {name: value for name, value in self.cleaned_data.items()
                if not (name in THRESHOLDS and value is None)}


def add_errors(form: forms.Form, error: ValidationError) -> None:
    """``error`` from services.save_policy on the form: each message on its field, or above the
    form when it is about no field of this form (the pool, the policy's existence)."""
    for field, messages in error.message_dict.items():
        form.add_error(field if field in form.fields else None, messages)
