"""B9's two tables as people export them, built here in the shapes of two public ones (the
benchmark downloads nothing):

- a daily weather table, CSV: 1,461 days written ``2012/01/01``, precipitation, temperatures and
  wind -> the day's weather (5 classes). Precipitation says rain, drizzle or snow; whether a dry
  day was logged ``fog`` or ``sun`` follows the season (foggy autumns and winters) and the year
  (the station logged fog less from 2014): only the date tells them apart.
- a cars table, a JSON array of 406 records: a near-unique ``Name`` whose first word is the maker,
  miles per gallon with 8 gaps, horsepower with 6, a ``Year`` date, and the ``Origin`` (usa,
  japan, europe), which the makers and the cars' size and weight say.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np

WEATHER_DAYS = 1_461
CARS = 406
_MAKERS = {
    "usa": ("chevrolet", "ford", "plymouth", "amc", "dodge", "buick", "pontiac", "mercury"),
    "japan": ("toyota", "datsun", "honda", "mazda", "subaru", "nissan"),
    "europe": ("volkswagen", "peugeot", "fiat", "audi", "volvo", "saab", "bmw", "opel", "renault"),
}
_MODELS = (
    "malibu", "custom", "deluxe", "wagon", "sw", "coupe", "sedan", "gt", "brougham", "special",
    "classic", "sport", "liftback", "hatchback", "estate", "turbo", "diesel", "limited", "ii",
)  # fmt: skip
_ORIGIN_SHARE = {"usa": 254, "japan": 79, "europe": 73}
_CYLINDERS = {  # the counts each origin builds, and their shares
    "usa": ((4, 6, 8), (0.3, 0.3, 0.4)),
    "japan": ((3, 4, 6), (0.05, 0.85, 0.1)),
    "europe": ((4, 5, 6), (0.85, 0.05, 0.1)),
}


def write_weather(directory: Path, seed: int = 0) -> Path:
    """The weather table as ``weather.csv`` in ``directory``."""
    import pandas as pd

    rng = np.random.default_rng(seed)
    days = pd.date_range("2012-01-01", periods=WEATHER_DAYS, freq="D")
    doy = days.dayofyear.to_numpy()
    winter = np.cos(2 * math.pi * (doy - 15) / 365.25)  # 1 mid-January, -1 mid-July
    temp_max = 15 - 9 * winter + rng.normal(0, 3, len(days))
    temp_min = temp_max - 6 - np.abs(rng.normal(0, 2, len(days)))
    wet = rng.random(len(days)) < 0.45 + 0.3 * winter
    precipitation = np.where(wet, rng.exponential(6, len(days)), 0.0)
    wind = np.clip(3.5 + winter + rng.normal(0, 1.2, len(days)), 0.4, None)
    autumn = (doy >= 260) & (doy <= 350)
    fog_odds = np.where(autumn, 0.7, 0.3 * np.clip(winter, 0, None))
    fog_odds = np.where(days.year < 2014, fog_odds, fog_odds / 4)
    dry = np.where(rng.random(len(days)) < fog_odds, "fog", "sun")
    weather = np.where(
        ~wet, dry, np.where(temp_max < 3, "snow", np.where(precipitation < 1, "drizzle", "rain"))
    )
    table = pd.DataFrame(
        {
            "date": days.strftime("%Y/%m/%d"),
            "precipitation": precipitation.round(1),
            "temp_max": temp_max.round(1),
            "temp_min": temp_min.round(1),
            "wind": wind.round(1),
            "weather": weather,
        }
    )
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "weather.csv"
    table.to_csv(path, index=False)
    return path


def _car(rng: np.random.Generator, origin: str) -> dict:
    counts, shares = _CYLINDERS[origin]
    cylinders = int(rng.choice(counts, p=shares))
    per_cylinder = 45 if origin == "usa" else 28
    displacement = cylinders * per_cylinder * rng.uniform(0.8, 1.25)
    horsepower = 20 + 0.45 * displacement * rng.uniform(0.8, 1.2)
    weight = 1_400 + 8 * displacement + rng.normal(0, 250)
    year = int(rng.integers(70, 83))
    mpg = max(9.0, 46 - weight / 130 + 0.7 * (year - 70) + rng.normal(0, 2.5))
    words = rng.choice(_MODELS, size=int(rng.integers(1, 3)), replace=False)
    name = " ".join([str(rng.choice(_MAKERS[origin])), *words])
    if rng.random() < 0.6:
        name += f" {rng.integers(100, 999)}"
    return {
        "Name": name,
        "Miles_per_Gallon": round(float(mpg), 1),
        "Cylinders": cylinders,
        "Displacement": round(float(displacement)),
        "Horsepower": round(float(horsepower)),
        "Weight_in_lbs": round(float(weight)),
        "Acceleration": round(float(21 - horsepower / 20 + rng.normal(0, 1.5)), 1),
        "Year": f"19{year}-01-01",
        "Origin": origin,
    }


def write_cars(directory: Path, seed: int = 0) -> Path:
    """The cars table as ``cars.json`` (one JSON array) in ``directory``."""
    rng = np.random.default_rng(seed)
    origins = [o for o, n in _ORIGIN_SHARE.items() for _ in range(n)]
    rng.shuffle(origins)
    records = [_car(rng, origin) for origin in origins]
    for i in rng.choice(CARS, size=8, replace=False):
        records[i]["Miles_per_Gallon"] = None
    for i in rng.choice(CARS, size=6, replace=False):
        records[i]["Horsepower"] = None
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "cars.json"
    path.write_text(json.dumps(records, indent=1))
    return path
