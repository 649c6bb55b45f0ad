from __future__ import annotations

from typing import Any

from django import forms
from django.core.exceptions import ValidationError

from console.fleet.discovery import connector_name
from console.fleet.models import GIB, MAX_CPU_FLAGS, Node, validate_cpu_flag
from inference.kv_channels import CHANNEL_NAMES


class NodeForm(forms.ModelForm):
    """A node added by hand: its facts are what the operator says until agents report them."""

    cpu_count = forms.IntegerField(min_value=1, max_value=4096, label="CPU cores")
    memory_gib = forms.FloatField(min_value=0.1, max_value=1 << 20, label="Memory (GiB)")
    cpu_flags = forms.CharField(
        required=False, widget=forms.Textarea(attrs={"rows": 2}), label="CPU flags",
        help_text="the flags line of the node's /proc/cpuinfo (grep -m1 flags /proc/cpuinfo); "
                  "empty when unknown, and checks then cannot tell which of vLLM's CPU kernels "
                  "it has")
    kv_connectors = forms.MultipleChoiceField(
        choices=[(n, n) for n in sorted(connector_name(c) for c in CHANNEL_NAMES)],
        required=False, widget=forms.CheckboxSelectMultiple, label="KV connectors")
    gpus = forms.CharField(
        required=False, widget=forms.Textarea(attrs={"rows": 2}), label="GPUs",
        help_text="one per line: index, name, memory in GiB (e.g. '0, NVIDIA L4, 24')")

    class Meta:
        model = Node
        fields = ["name", "address", "engine_version"]

    def clean_gpus(self) -> list[dict[str, Any]]:
        gpus = []
        for number, line in enumerate(self.cleaned_data["gpus"].splitlines(), start=1):
            if not line.strip():
                continue
            parts = [p.strip() for p in line.split(",")]
            try:
                index, name, memory = int(parts[0]), parts[1], float(parts[2])
            except (IndexError, ValueError) as exc:
                raise ValidationError(f"line {number}: expected 'index, name, memory GiB', "
                                      f"got {line!r}") from exc
            if index < 0 or memory <= 0:
                raise ValidationError(f"line {number}: index must be >= 0 and memory > 0")
            gpus.append({"index": index, "name": name, "memory_bytes": int(memory * GIB)})
        if len({g["index"] for g in gpus}) != len(gpus):
            raise ValidationError("GPU indices must be distinct")
        return gpus

    def clean_cpu_flags(self) -> list[str]:
        # Pasting the whole line ("flags\t\t: fpu vme ...") is the easy way: its name is dropped.
        text = self.cleaned_data["cpu_flags"]
        flags = sorted(set(text.partition(":")[2].split() if ":" in text else text.split()))
        if len(flags) > MAX_CPU_FLAGS:
            raise ValidationError(f"at most {MAX_CPU_FLAGS} flags")
        for flag in flags:
            validate_cpu_flag(flag)
        return flags

    def node_fields(self) -> dict[str, Any]:
        data = self.cleaned_data
        return {"name": data["name"], "address": data["address"],
                "engine_version": data["engine_version"],
                "cpu_ids": list(range(data["cpu_count"])),
                "memory_bytes": int(data["memory_gib"] * GIB), "cpu_flags": data["cpu_flags"],
                "kv_connectors": data["kv_connectors"], "gpus": data["gpus"]}
