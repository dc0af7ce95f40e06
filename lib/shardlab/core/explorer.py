"""The explorer hook: a notebook's interactive cell is declared by its topic and built here, once for all topics.

Design note
-----------
Every notebook's explorer had one shape: controls over some of the notebook's parameters (sliders, dropdowns, a
checkbox, a text box), a callback that rebuilds the case(s) from the controls' values and returns what it
measured, a status line (red with the rule's message when the combination is illegal — shown, never raised), and a
table and / or a figure below. A topic now only *declares* that (:class:`Explorer`) in its folder's
``explorers.py`` as ``EXPLORERS = {notebook stem: Explorer(...)}``; :func:`explorer_for` builds it from the
notebook's parameter object, found through the registry (:func:`shardlab.core.topics.explorer_of`)::

    Explorer(controls={"tp": Slider(1, 8), "hidden": Slider(4, 128, 4)},     # which values, which ranges
             evaluate=lambda p, v: explore("mlp", **v),                      # rebuild the case(s), measure
             show=lambda res, v: Shown(res["formula"] == res["ledger"], f"formula {res['formula']} ..."))

    ui, update = explorer_for(p, tp=min(p.tp, 4))    # in the notebook: initial values; `ui` displays the widgets

``update(**values)`` is what a control change runs (headless runs call it: no browser is needed); it returns
``{"ok", **evaluate's result, **values}`` — or ``{"ok": False, "error": message, **values}`` when ``evaluate``
raised one of the declared ``errors``. A control's initial value is the call's keyword, else the declaration's
``initial(p)``, else (a declaration over the parameter dataclass's own ``fields``, which ``evaluate`` then gets
with the controls' values in them) the parameter object's field, else the control's ``default`` (a choice: its
first option). Keywords that name no control are fixed settings
handed to ``evaluate`` with the values.

Widget output is set directly (``Output.outputs = ()``, ``append_display_data``), never captured with
``with out: display(...)``: the capture route hung headless (papermill / nbclient) kernels intermittently, and
tables go into an ``HTML`` widget, not an ``Output`` (repeated display into an Output hung a papermill kernel on
the third update).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, fields, is_dataclass, replace
from typing import Any

import ipywidgets as widgets

from shardlab.core.topics import explorer_of

ERROR_STYLE = "<b style='color:#c00'>{}</b>"


# ---------------------------------------------------------------------------------------------------- controls
@dataclass(frozen=True)
class Slider:
    """An int slider (a float slider when ``step`` is a float) over ``[lo, hi]``."""

    lo: float
    hi: float
    step: float = 1
    label: str = ""
    default: Any = None

    def widget(self, name: str, value: Any, base: Any) -> widgets.Widget:
        cls = widgets.FloatSlider if isinstance(self.step, float) else widgets.IntSlider
        value = self.lo if value is None else value
        return cls(value=value, min=self.lo, max=self.hi, step=self.step, description=self.label or name)


@dataclass(frozen=True)
class Choice:
    """A dropdown; ``options`` are values or ``(label, value)`` pairs, or a function of the parameter object
    that returns them."""

    options: Sequence[Any] | Callable[[Any], Sequence[Any]]
    label: str = ""
    default: Any = None

    def widget(self, name: str, value: Any, base: Any) -> widgets.Widget:
        options = list(self.options(base) if callable(self.options) else self.options)
        first = options[0][1] if isinstance(options[0], tuple) else options[0]
        return widgets.Dropdown(options=options, value=first if value is None else value,
                                description=self.label or name)


@dataclass(frozen=True)
class Toggle:
    """A checkbox."""

    label: str = ""
    default: bool = False

    def widget(self, name: str, value: Any, base: Any) -> widgets.Widget:
        return widgets.Checkbox(value=bool(value), description=self.label or name)


@dataclass(frozen=True)
class Number:
    """An integer box (bounded by ``lo`` / ``hi`` when given)."""

    lo: int | None = None
    hi: int | None = None
    label: str = ""
    default: int | None = None

    def widget(self, name: str, value: Any, base: Any) -> widgets.Widget:
        if self.lo is None:
            return widgets.IntText(value=value, description=self.label or name)
        return widgets.BoundedIntText(value=value, min=self.lo, max=self.hi, description=self.label or name)


@dataclass(frozen=True)
class Text:
    """A text box whose text ``parse`` turns into the value (its errors are shown like ``evaluate``'s);
    ``write`` turns a value given as a keyword into the text."""

    parse: Callable[[str], Any]
    write: Callable[[Any], str] = str
    label: str = ""
    default: str = ""

    def widget(self, name: str, value: Any, base: Any) -> widgets.Widget:
        return widgets.Text(value=self.text(value), description=self.label or name)

    def text(self, value: Any) -> str:
        return value if isinstance(value, str) else self.write(value)


Control = Slider | Choice | Toggle | Number | Text


# ------------------------------------------------------------------------------------------------ declaration
@dataclass(frozen=True)
class Shown:
    """What one evaluation shows: ``ok`` (the numbers agree), the status line (HTML) and a table (HTML) and / or a
    figure (plotly; ``update`` returns it as ``"figure"``)."""

    ok: bool
    status: str
    table: str = ""
    figure: Any = None


@dataclass(frozen=True)
class Explorer:
    """A topic's explorer, declared (see the module note)."""

    controls: Mapping[str, Control]
    evaluate: Callable[[Any, dict[str, Any]], Mapping[str, Any]]  # (parameter object, values) -> measured
    show: Callable[[Mapping[str, Any], dict[str, Any]], Shown]  # (measured, values) -> the widgets' content
    fields: bool = False  # the controls are fields of the parameter dataclass: initial values from it
    initial: Callable[[Any], Mapping[str, Any]] | None = None  # initial values computed from the parameter object
    rows: tuple[int, ...] = (3,)  # controls per row (the rest on the last row)
    errors: tuple[type[BaseException], ...] = (ValueError,)  # what a bad combination raises (shown, not raised)
    reason: Callable[[BaseException], str] = str  # the message shown for such an error
    button: str = ""  # a button with this label runs it (a compile per run) instead of every control change

    def __post_init__(self) -> None:
        if not self.controls:
            raise ValueError("an Explorer needs at least one control")

    def values(self, base: Any, given: Mapping[str, Any]) -> dict[str, Any]:
        """Each control's initial value (the module note's order)."""
        known = {f.name for f in fields(base)} if self.fields and is_dataclass(base) else set()
        computed = dict(self.initial(base)) if self.initial is not None else {}
        out = {}
        for name, control in self.controls.items():
            if name in given:
                out[name] = given[name]
            elif name in computed:
                out[name] = computed[name]
            elif name in known:
                out[name] = getattr(base, name)
            else:
                out[name] = control.default
        return out


# ------------------------------------------------------------------------------------------------------- built
class Live:
    """A built explorer: ``widget`` to display, ``update(**values)`` what a control change runs, ``controls`` by
    name, ``result`` the last update's return. Unpacks as ``ui, update = explorer_for(p)``; ``live.<control>`` is that
    control's widget and ``live.<key>`` the last result's value (None when it has none)."""

    def __init__(self, spec: Explorer, base: Any, values: Mapping[str, Any], fixed: Mapping[str, Any]) -> None:
        self.spec, self.base, self.fixed = spec, base, dict(fixed)
        self.controls = {name: c.widget(name, values[name], base) for name, c in spec.controls.items()}
        self.status, self.table, self.out = widgets.HTML(), widgets.HTML(), widgets.Output()
        self.result: dict[str, Any] = {}
        items, rows, start = list(self.controls.values()), [], 0
        for n in spec.rows:
            if start < len(items):
                rows.append(widgets.HBox(items[start:start + n]))
            start += n
        if start < len(items):
            rows.append(widgets.HBox(items[start:]))
        if spec.button:
            run = widgets.Button(description=spec.button)
            run.on_click(lambda _b: self.update())
            rows[-1] = widgets.HBox([*rows[-1].children, run])
        else:
            for w in self.controls.values():
                w.observe(lambda _change: self.update(), names="value")
        self.widget = widgets.VBox([*rows, self.status, self.table, self.out])

    def __iter__(self) -> Iterator[Any]:
        yield self.widget
        yield self.update

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_") or name in ("controls", "result"):
            raise AttributeError(name)
        return self.controls[name] if name in self.controls else self.result.get(name)

    def update(self, **given: Any) -> dict[str, Any]:
        """Re-evaluate at the controls' values (``given`` ones replace them, without moving the widgets) and show
        the outcome; returns what was shown (see the module note)."""
        unknown = sorted(set(given) - set(self.controls))
        if unknown:
            raise TypeError(f"update() got {unknown}; the controls are {sorted(self.controls)}")
        raw = {name: given.get(name, w.value) for name, w in self.controls.items()}
        self.out.outputs = ()  # no `with out:` capture (module note)
        try:
            values = {name: c.parse(c.text(raw[name])) if isinstance(c, Text) else raw[name]
                      for name, c in self.spec.controls.items()}
            base = replace(self.base, **values) if self.spec.fields else self.base
            result = dict(self.spec.evaluate(base, {**values, **self.fixed}))
        except self.spec.errors as e:  # a bad combination is shown, not raised: the learner moves a control back
            msg = self.spec.reason(e)
            self.status.value, self.table.value = ERROR_STYLE.format(msg), ""
            self.result = {"ok": False, "error": msg, **raw}
            return self.result
        shown = self.spec.show(result, values)
        self.status.value, self.table.value = shown.status, shown.table
        if shown.figure is not None:
            self.out.append_display_data(shown.figure)
            result["figure"] = shown.figure
        self.result = {"ok": shown.ok, **result, **raw}
        return self.result


def explorer_for(params: Any, /, **values: Any) -> Live:
    """The explorer of ``params``'s notebook (its topic's declaration), its controls set to ``values`` (see the
    module note); keywords naming no control are fixed settings handed to the evaluation."""
    spec = explorer_of(params.NOTEBOOK)
    given = {k: v for k, v in values.items() if k in spec.controls}
    return build(spec, params, given, {k: v for k, v in values.items() if k not in spec.controls})


def build(spec: Explorer, params: Any, given: Mapping[str, Any] | None = None,
          fixed: Mapping[str, Any] | None = None) -> Live:
    """``spec`` built over ``params`` (a declaration not registered to a notebook: tests, a throwaway topic)."""
    return Live(spec, params, spec.values(params, given or {}), fixed or {})


def cause(e: BaseException) -> str:
    """The message of what made ``e`` (a rank's error re-raised by the world), else ``e``'s own."""
    return str(e.__cause__ or e)
