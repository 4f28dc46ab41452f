"""A small table of physical and data units: parse a quantity, convert between compatible units."""

from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True)
class Unit:
    """``base = (value + shift) * factor`` in the dimension's base unit."""

    symbol: str
    dimension: str
    factor: float
    shift: float = 0.0

    def to_base(self, value: float) -> float:
        return (value + self.shift) * self.factor

    def from_base(self, value: float) -> float:
        return value / self.factor - self.shift


def _units() -> dict[str, Unit]:
    table: dict[str, Unit] = {}

    def add(symbol: str, dimension: str, factor: float, *aliases: str, shift: float = 0.0) -> None:
        unit = Unit(symbol, dimension, factor, shift)
        for name in (symbol, *aliases):
            table[name] = unit

    add("m", "length", 1.0, "meter", "meters", "metre", "metres")
    add("km", "length", 1e3, "kilometer", "kilometers", "kilometre", "kilometres")
    add("cm", "length", 1e-2, "centimeter", "centimeters", "centimetre", "centimetres")
    add("mm", "length", 1e-3, "millimeter", "millimeters", "millimetre", "millimetres")
    add("in", "length", 0.0254, "inch", "inches")
    add("ft", "length", 0.3048, "foot", "feet")
    add("yd", "length", 0.9144, "yard", "yards")
    add("mi", "length", 1609.344, "mile", "miles")
    add("kg", "mass", 1.0, "kilogram", "kilograms")
    add("g", "mass", 1e-3, "gram", "grams")
    add("mg", "mass", 1e-6, "milligram", "milligrams")
    add("t", "mass", 1e3, "tonne", "tonnes")
    add("lb", "mass", 0.45359237, "lbs", "pound", "pounds")
    add("oz", "mass", 0.028349523125, "ounce", "ounces")
    add("s", "time", 1.0, "sec", "secs", "second", "seconds")
    add("ms", "time", 1e-3, "millisecond", "milliseconds")
    add("min", "time", 60.0, "mins", "minute", "minutes")
    add("h", "time", 3600.0, "hr", "hrs", "hour", "hours")
    add("day", "time", 86400.0, "days", "d")
    add("week", "time", 604800.0, "weeks")
    add("L", "volume", 1e-3, "l", "liter", "liters", "litre", "litres")
    add("mL", "volume", 1e-6, "ml", "milliliter", "milliliters", "millilitre", "millilitres")
    add("m3", "volume", 1.0, "m^3", "m³", "cubic meter", "cubic meters")
    add("gal", "volume", 3.785411784e-3, "gallon", "gallons")
    add("B", "data", 1.0, "byte", "bytes")
    add("KB", "data", 1e3, "kB", "kilobyte", "kilobytes")
    add("MB", "data", 1e6, "megabyte", "megabytes")
    add("GB", "data", 1e9, "gigabyte", "gigabytes")
    add("TB", "data", 1e12, "terabyte", "terabytes")
    add("KiB", "data", 1024.0, "kibibyte", "kibibytes")
    add("MiB", "data", 1024.0**2, "mebibyte", "mebibytes")
    add("GiB", "data", 1024.0**3, "gibibyte", "gibibytes")
    add("m/s", "speed", 1.0, "meters per second", "metres per second")
    add("km/h", "speed", 1 / 3.6, "kph", "kmh", "kilometers per hour", "kilometres per hour")
    add("mph", "speed", 0.44704, "miles per hour")
    add("kn", "speed", 1852 / 3600, "knot", "knots")
    add("m2", "area", 1.0, "m^2", "m²", "square meter", "square meters", "square metre", "square metres")
    add("km2", "area", 1e6, "km^2", "km²", "square kilometer", "square kilometers")
    add("ha", "area", 1e4, "hectare", "hectares")
    add("acre", "area", 4046.8564224, "acres")
    add("ft2", "area", 0.09290304, "ft^2", "ft²", "sq ft", "square foot", "square feet")
    add("J", "energy", 1.0, "joule", "joules")
    add("kJ", "energy", 1e3, "kilojoule", "kilojoules")
    add("cal", "energy", 4.184, "calorie", "calories")
    add("kcal", "energy", 4184.0, "kilocalorie", "kilocalories")
    add("Wh", "energy", 3600.0, "watt hour", "watt hours")
    add("kWh", "energy", 3.6e6, "kilowatt hour", "kilowatt hours")
    add("%", "ratio", 0.01, "percent")
    add("K", "temperature", 1.0, "kelvin")
    add("°C", "temperature", 1.0, "C", "degC", "celsius", "degrees celsius", "degrees C", shift=273.15)
    add("°F", "temperature", 5 / 9, "F", "degF", "fahrenheit", "degrees fahrenheit", "degrees F", shift=459.67)
    return table


UNITS: dict[str, Unit] = _units()
_LOWER: dict[str, Unit] = {}
for _name, _unit in UNITS.items():
    _LOWER.setdefault(_name.lower(), _unit)


def find_unit(name: str) -> Unit | None:
    """The unit called ``name`` (exact spelling first, then case-insensitively), or None."""
    name = name.strip()
    return UNITS.get(name) or _LOWER.get(name.lower())


def known_unit_symbols() -> list[str]:
    return sorted({unit.symbol for unit in UNITS.values()})


_NUMBER = r"[-+−]?(?:\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d+(?:\.\d+)?(?:[eE][-+]?\d+)?|\.\d+)(?:\s*/\s*\d+)?"
_ALIASES = sorted(UNITS, key=len, reverse=True)
_UNIT = "|".join(re.escape(alias) for alias in _ALIASES)
QUANTITY = re.compile(
    rf"(?P<number>{_NUMBER})(?:[ \t]*(?P<unit>{_UNIT})(?![A-Za-z0-9]))?",
    re.IGNORECASE,
)


@dataclass(frozen=True)
class Quantity:
    value: float
    unit: Unit | None
    text: str


def parse_number(text: str) -> float:
    """``text`` ("1,234.5", "-3/4", "2e3", "−7") as a float; ValueError if it is not a number."""
    cleaned = text.replace(",", "").replace("−", "-").replace(" ", "")
    if "/" in cleaned:
        numerator, denominator = cleaned.split("/", 1)
        return float(numerator) / float(denominator)
    return float(cleaned)


def last_quantity(text: str) -> Quantity | None:
    """The last number in ``text`` with the unit written after it, if any."""
    found: Quantity | None = None
    for match in QUANTITY.finditer(text):
        try:
            value = parse_number(match.group("number"))
        except (ValueError, ZeroDivisionError):
            continue
        unit_text = match.group("unit")
        found = Quantity(value, find_unit(unit_text) if unit_text else None, match.group(0).strip())
    return found
