package db

import (
	"fmt"
	"strings"
)

// NewestFirst completes a list's statement as one page of it, newest id
// first: base is its SELECT … WHERE lead = $1 (args its parameters, lead's
// value first), and the page holds the rows after cursor (the previous
// page's last id; "" for the first page) whose column equals value (""
// for any), limit at most. It answers the statement and its arguments. The
// table has an index on (lead, id) and one on (lead, column, id).
//
// Each condition is written only when it applies, and the cursor's as a
// bound of the whole key of the index the page is read from. One that
// holds for an empty value as for any (OR) is a filter in a plan made for
// any value (a prepared statement's generic plan), and "id < cursor" alone
// bounds the primary key as well: such plans read the table's primary key
// backwards, every workspace's rows and every value's, and kept the page's
// (scale QA: 400,000 runs, the 50 FAILED of one workspace read all 400,000
// for a page; 8,980 read for a page after a cursor).
func NewestFirst(base, lead string, args []any, cursor, column, value string, limit int) (string, []any) {
	keys, bounds := []string{lead}, []string{"$1::text"}
	if value != "" {
		args = append(args, value)
		base += fmt.Sprintf(" AND %s = $%d::text", column, len(args))
		keys, bounds = append(keys, column), append(bounds, fmt.Sprintf("$%d::text", len(args)))
	}
	if cursor != "" {
		args = append(args, cursor)
		base += fmt.Sprintf(" AND (%s, id) < (%s, $%d::text)", strings.Join(keys, ", "), strings.Join(bounds, ", "),
			len(args))
	}
	args = append(args, limit)
	return base + fmt.Sprintf(" ORDER BY %s DESC, id DESC LIMIT $%d::int", strings.Join(keys, " DESC, "), len(args)), args
}
