#!/usr/bin/env bash
# From a raw click log to a trained PyTorch model, every data step a tabloader command.
# ROWS (rows a day, default 200000) and OUT (default examples/clicklog/data) may be set.
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
OUT="${OUT:-$HERE/data}"
ROWS="${ROWS:-200000}"
COLUMNS=(--cats user_id,item_id,country,event_time_hour,event_time_dow
         --conts price,dwell_sec --label click --fill-null price=0,dwell_sec=0
         --rows event_time_hour=24,event_time_dow=7)

# 1. The raw log: two days of CSV with text ids, times, and empty cells.
python "$HERE/make_log.py" "$OUT/raw" --rows "$ROWS"

# 2. Day 1 as parquet: ids by frequency (counted on the training split), the hour and day
#    of the week of each click, a validation split that keeps each user's rows together.
tabloader convert "$OUT/raw/day1.csv" "$OUT/day1" --overwrite --quiet \
    --split valid=0.1 --split-key user_id \
    --categorify user_id,item_id,country --min-count 2 \
    --time-parts event_time=hour,dow

# 3. Check it as the loader will read it: exit status 0 means training will not fail.
tabloader inspect "$OUT/day1/train" --vocabulary "$OUT/day1" \
    --cats user_id,item_id,country,event_time_hour,event_time_dow \
    --conts price,dwell_sec --labels click --fill-null price=0,dwell_sec=0

# 4. Train, and keep the model.
python "$HERE/train_torch.py" --data "$OUT/day1" "${COLUMNS[@]}" --save "$OUT/model.pt"

# 5. Day 2 with day 1's vocabulary: the same user gets the same id, new ones id 0.
tabloader convert "$OUT/raw/day2.csv" "$OUT/day2" --overwrite --quiet \
    --vocabulary "$OUT/day1" --time-parts event_time=hour,dow
python "$HERE/train_torch.py" --data "$OUT/day2" "${COLUMNS[@]}" --evaluate "$OUT/model.pt"
