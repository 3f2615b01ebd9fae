package money_test

import (
	"encoding/json"
	"math/big"
	"regexp"
	"strings"
	"testing"

	"github.com/getratchet/ratchet/lib/apierr"
	"github.com/getratchet/ratchet/lib/jsonstrict"
	"github.com/getratchet/ratchet/lib/money"
)

// amounts holds an amount field of each spelling the API uses (snake_case
// on the gate, camelCase on durable jobs), as request types declare them.
type amounts struct {
	CostMicros   *int64 `json:"cost_micros"`
	BudgetMicros *int64 `json:"budgetMicros"`
}

var integerLiteral = regexp.MustCompile(`^-?(0|[1-9][0-9]*)$`)

// FuzzAmount: an amount field takes exactly the integer literals within
// int64, as written (never rounded through a float); Valid takes exactly
// 0 to 10^18 of them; any other number (an integer literal beyond int64,
// 1.5, 1e6) is told the amounts' rule, and any other value (a string, a
// boolean) what it must be, never the rule. Two valid amounts sum
// within int64 (ceilings add a grant to a day's counter).
func FuzzAmount(f *testing.F) {
	for _, s := range []string{"0", "1", "-1", "-0", "1000000000000000000", "1000000000000000001",
		"9223372036854775807", "9223372036854775808", "-9223372036854775808", "99999999999999999999999",
		"1.0", "1e6", "1E6", "0.5", "1e400", "\"5\"", "null", "true", "[]", "{}", "01", "9007199254740993"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, lit string) {
		if !json.Valid([]byte(lit)) {
			return
		}
		for _, field := range []string{"cost_micros", "budgetMicros"} {
			var a amounts
			err := jsonstrict.Decode([]byte(`{"`+field+`":`+lit+`}`), &a)
			v := a.CostMicros
			if field == "budgetMicros" {
				v = a.BudgetMicros
			}
			trimmed := strings.Trim(lit, " \t\r\n") // JSON's white space
			exact, isInt := new(big.Int).SetString(trimmed, 10)
			isInt = isInt && integerLiteral.MatchString(trimmed)
			var decoded any
			dec := json.NewDecoder(strings.NewReader(trimmed))
			dec.UseNumber()
			_ = dec.Decode(&decoded)
			_, isNumber := decoded.(json.Number)
			switch {
			case err == nil && trimmed == "null":
				if v != nil {
					t.Fatalf("null decoded as %d", *v)
				}
			case err == nil:
				if !isInt || v == nil || big.NewInt(*v).Cmp(exact) != 0 {
					t.Fatalf("%s: %s accepted as %v", field, lit, v)
				}
				inRange := exact.Sign() >= 0 && exact.Cmp(big.NewInt(money.MaxMicros)) <= 0
				if money.Valid(*v) != inRange {
					t.Fatalf("Valid(%d) = %v", *v, money.Valid(*v))
				}
			default:
				ae, ok := apierr.As(err)
				problems, _ := ae.Detail["validation"].([]apierr.FieldError)
				if !ok || len(problems) != 1 || problems[0].Field != field {
					t.Fatalf("%s: %s refused as %v", field, lit, err)
				}
				msg := problems[0].Message
				switch {
				case isInt && exact.IsInt64():
					t.Fatalf("%s: %s, an int64, refused: %s", field, lit, msg)
				case isNumber && msg != money.Rule:
					t.Fatalf("%s: %s told %q", field, lit, msg)
				case !isNumber && msg == money.Rule:
					t.Fatalf("%s: %s, not a number, told the amounts' range", field, lit)
				}
			}
		}
	})
}

// FuzzValidSum: any two amounts Valid takes sum within int64, to an
// amount no smaller than either.
func FuzzValidSum(f *testing.F) {
	f.Add(int64(0), int64(0))
	f.Add(money.MaxMicros, money.MaxMicros)
	f.Add(int64(-1), int64(1))
	f.Fuzz(func(t *testing.T, a, b int64) {
		if !money.Valid(a) || !money.Valid(b) {
			return
		}
		if s := a + b; s < a || s < b {
			t.Fatalf("%d + %d overflows to %d", a, b, s)
		}
	})
}
