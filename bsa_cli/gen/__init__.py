"""`bsa gen`: a case's arrays op by op (`arrays`), one case and whole suites written (`generate`), and the
cost model that sizes and schedules them (`schedule`)."""
