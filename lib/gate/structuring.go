package gate

import (
	"context"
	"fmt"
	"time"
)

// Structuring is how closely the costs declared for an effect type crowd
// its watch line (seed 003, structuring_threshold_micros): a line never
// enforced, such as a reporting or review limit, that callers may split
// amounts to stay under. Honest amounts thin out smoothly towards a line;
// a pile-up just below it, with little at or above, is the pattern to look
// at.
type Structuring struct {
	EffectType string `json:"effect_type"`
	// ThresholdMicros is the line: structuring_threshold_micros, else
	// max_cost_micros, else null (then only declarations are counted).
	ThresholdMicros *int64 `json:"threshold_micros"`
	// ThresholdFrom names the policy field the line comes from.
	ThresholdFrom *string             `json:"threshold_from" openapi:"enum=structuring_threshold_micros|max_cost_micros"`
	AsOf          time.Time           `json:"as_of"`
	Windows       []StructuringWindow `json:"windows" openapi:"notNull"` // one a structuringWindows entry
}

// StructuringWindow counts the begins that declared a cost in the hours up to
// as_of, by where the cost sat against the line (null without a line).
type StructuringWindow struct {
	Hours              int    `json:"hours"`
	Declared           int64  `json:"declared"`
	Below80Percent     *int64 `json:"below_80_percent"`
	From80To90Percent  *int64 `json:"from_80_to_90_percent"`
	From90To100Percent *int64 `json:"from_90_to_100_percent"`
	AtOrAbove          *int64 `json:"at_or_above"`
	// ShareJustBelow is from_90_to_100_percent / declared: null without a
	// line or without declarations.
	ShareJustBelow *float64 `json:"share_just_below"`
}

// structuringWindows are the windows measured, in hours, in answer order.
var structuringWindows = []int{24, 168}

// Structuring measures the type's declared costs against its watch line
// over the last 24 hours and 7 days, with the policy as it is now.
func (s *Service) Structuring(ctx context.Context, workspaceID, effectType string) (Structuring, error) {
	if err := checkEffectType(effectType); err != nil {
		return Structuring{}, err
	}
	now := s.clock()
	out := Structuring{EffectType: effectType, AsOf: now}
	rows, err := s.pool.Query(ctx, sqlStructuring, workspaceID, effectType, now)
	if err != nil {
		return Structuring{}, fmt.Errorf("structuring: %w", err)
	}
	defer rows.Close()
	byHours := map[int]StructuringWindow{}
	for rows.Next() {
		var (
			hours *int32
			w     StructuringWindow
			bands [4]int64
		)
		if err := rows.Scan(&out.ThresholdMicros, &out.ThresholdFrom, &hours, &w.Declared,
			&bands[0], &bands[1], &bands[2], &bands[3]); err != nil {
			return Structuring{}, fmt.Errorf("structuring: %w", err)
		}
		if hours == nil {
			continue // no declarations in the window: the row of the empty join
		}
		w.Below80Percent, w.From80To90Percent, w.From90To100Percent, w.AtOrAbove =
			&bands[0], &bands[1], &bands[2], &bands[3]
		byHours[int(*hours)] = w
	}
	if err := rows.Err(); err != nil {
		return Structuring{}, fmt.Errorf("structuring: %w", err)
	}
	for _, h := range structuringWindows {
		w, ok := byHours[h]
		if !ok {
			var zero [4]int64
			w = StructuringWindow{Below80Percent: &zero[0], From80To90Percent: &zero[1],
				From90To100Percent: &zero[2], AtOrAbove: &zero[3]}
		}
		w.Hours = h
		if out.ThresholdMicros == nil {
			w.Below80Percent, w.From80To90Percent, w.From90To100Percent, w.AtOrAbove = nil, nil, nil, nil
		} else if w.Declared > 0 {
			share := float64(*w.From90To100Percent) / float64(w.Declared)
			w.ShareJustBelow = &share
		}
		out.Windows = append(out.Windows, w)
	}
	return out, nil
}
