// CSV as RFC 4180 writes it, for bin/predict's predictions file: fields joined by commas, a field
// quoted when it holds a comma, a quote or a line break (its quotes doubled), lines ended by "\n".
// Spreadsheets, pandas and Python's csv module read it back unchanged.
#pragma once

#include <string>
#include <vector>

std::string csv_field(const std::string& text);
std::string csv_line(const std::vector<std::string>& fields);
