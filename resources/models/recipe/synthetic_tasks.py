"""The functions and classes synthetic_code.py draws from.

Each task: alternative names, alternative parameter lists (`name: type` strings; the
parameters are `{a}`, `{b}`, `{c}` in the texts), docstrings, bodies (4-space indented,
`str.format` fields `{a}` and `{f}`, literal braces doubled) and (call, result) pairs
that hold for every body. tests/test_recipes.py runs every body against its tests.
"""

from __future__ import annotations

TASKS: list[dict] = [
    dict(names=("fibonacci", "fib", "nth_fibonacci"), params=(("n: int",), ("k: int",)), ret="int",
         docs=("Return the {a}-th Fibonacci number.", "Compute the Fibonacci number at index {a}."),
         bodies=("""
    if {a} < 2:
        return {a}
    return {f}({a} - 1) + {f}({a} - 2)
""", """
    a, b = 0, 1
    for _ in range({a}):
        a, b = b, a + b
    return a
"""), tests=(("{f}(10)", "55"), ("{f}(1)", "1"), ("{f}(7)", "13"))),
    dict(names=("factorial", "fact"), params=(("n: int",),), ret="int",
         docs=("Return {a}! for a non-negative integer.", "Compute the factorial of {a}."),
         bodies=("""
    result = 1
    for i in range(2, {a} + 1):
        result *= i
    return result
""", """
    if {a} <= 1:
        return 1
    return {a} * {f}({a} - 1)
"""), tests=(("{f}(5)", "120"), ("{f}(0)", "1"))),
    dict(names=("is_prime", "check_prime"), params=(("n: int",), ("number: int",)), ret="bool",
         docs=("Return True if {a} is a prime number.", "Check whether {a} is prime."),
         bodies=("""
    if {a} < 2:
        return False
    for d in range(2, int({a} ** 0.5) + 1):
        if {a} % d == 0:
            return False
    return True
""", """
    if {a} < 2:
        return False
    i = 2
    while i * i <= {a}:
        if {a} % i == 0:
            return False
        i += 1
    return True
"""), tests=(("{f}(7)", "True"), ("{f}(12)", "False"), ("{f}(2)", "True"))),
    dict(names=("gcd", "greatest_common_divisor"), params=(("a: int", "b: int"), ("x: int", "y: int")), ret="int",
         docs=("Return the greatest common divisor of two integers.", "Euclid's algorithm."),
         bodies=("""
    {a}, {b} = abs({a}), abs({b})
    while {b}:
        {a}, {b} = {b}, {a} % {b}
    return {a}
""",), tests=(("{f}(12, 18)", "6"), ("{f}(7, 5)", "1"))),
    dict(names=("celsius_to_fahrenheit", "c_to_f", "to_fahrenheit"), params=(("celsius: float",), ("degrees: float",)),
         ret="float", docs=("Convert a temperature from Celsius to Fahrenheit.", "Return {a} in degrees Fahrenheit."),
         bodies=("""
    return {a} * 9 / 5 + 32
""", """
    fahrenheit = {a} * 1.8 + 32
    return fahrenheit
"""), tests=(("{f}(100)", "212.0"), ("{f}(0)", "32.0"))),
    dict(names=("fahrenheit_to_celsius", "f_to_c", "to_celsius"), params=(("fahrenheit: float",), ("degrees: float",)),
         ret="float", docs=("Convert a temperature from Fahrenheit to Celsius.", "Return {a} in degrees Celsius."),
         bodies=("""
    return ({a} - 32) * 5 / 9
""",), tests=(("{f}(212)", "100.0"), ("{f}(32)", "0.0"))),
    dict(names=("count_vowels", "vowel_count", "num_vowels"), params=(("text: str",), ("s: str",), ("word: str",)),
         ret="int", docs=("Count the vowels in {a}.", "Return how many vowels {a} contains."),
         bodies=("""
    count = 0
    for ch in {a}.lower():
        if ch in "aeiou":
            count += 1
    return count
""", """
    return sum(1 for ch in {a}.lower() if ch in "aeiou")
"""), tests=(("{f}('hello world')", "3"), ("{f}('xyz')", "0"))),
    dict(names=("is_palindrome", "palindrome"), params=(("word: str",), ("text: str",), ("s: str",)), ret="bool",
         docs=("Return True if {a} reads the same backwards.", "Check whether {a} is a palindrome."),
         bodies=("""
    cleaned = "".join(ch.lower() for ch in {a} if ch.isalnum())
    return cleaned == cleaned[::-1]
""", """
    return {a} == {a}[::-1]
"""), tests=(("{f}('level')", "True"), ("{f}('python')", "False"))),
    dict(names=("reverse_string", "reverse", "reversed_text"), params=(("text: str",), ("s: str",)), ret="str",
         docs=("Return {a} reversed.", "Reverse the characters of {a}."),
         bodies=("""
    return {a}[::-1]
""", """
    result = ""
    for ch in {a}:
        result = ch + result
    return result
"""), tests=(("{f}('abc')", "'cba'"), ("{f}('')", "''"))),
    dict(names=("word_count", "count_words"), params=(("text: str",), ("sentence: str",)), ret="int",
         docs=("Return the number of words in {a}.", "Count the whitespace-separated words in {a}."),
         bodies=("""
    return len({a}.split())
""", """
    words = {a}.split()
    return len(words)
"""), tests=(("{f}('the quick brown fox')", "4"), ("{f}('')", "0"))),
    dict(names=("word_frequencies", "count_each_word", "word_counts"), params=(("text: str",),), ret="dict[str, int]",
         docs=("Return a dict mapping each word in {a} to its count.", "Count how often each word occurs."),
         bodies=("""
    counts = {{}}
    for word in {a}.lower().split():
        counts[word] = counts.get(word, 0) + 1
    return counts
""", """
    counts: dict[str, int] = {{}}
    for word in {a}.split():
        word = word.lower()
        if word in counts:
            counts[word] += 1
        else:
            counts[word] = 1
    return counts
"""), tests=(("{f}('a b a')", "{'a': 2, 'b': 1}"), ("{f}('')", "{}"))),
    dict(names=("capitalize_words", "title_case"), params=(("text: str",), ("sentence: str",)), ret="str",
         docs=("Capitalize the first letter of every word in {a}.", "Return {a} in title case."),
         bodies=("""
    return " ".join(word.capitalize() for word in {a}.split())
""", """
    words = []
    for word in {a}.split():
        words.append(word[:1].upper() + word[1:].lower())
    return " ".join(words)
"""), tests=(("{f}('hello world')", "'Hello World'"),)),
    dict(names=("remove_duplicates", "unique", "dedupe"), params=(("items: list",), ("values: list",)), ret="list",
         docs=("Return the items of {a} without duplicates, keeping their order.", "Drop repeated values from {a}."),
         bodies=("""
    seen = set()
    result = []
    for item in {a}:
        if item not in seen:
            seen.add(item)
            result.append(item)
    return result
""", """
    return list(dict.fromkeys({a}))
"""), tests=(("{f}([1, 2, 1, 3, 2])", "[1, 2, 3]"), ("{f}([])", "[]"))),
    dict(names=("flatten", "flatten_list"), params=(("nested: list",), ("lists: list",)), ret="list",
         docs=("Flatten a list of lists into one list.", "Return the elements of {a} in a single list."),
         bodies=("""
    result = []
    for sub in {a}:
        result.extend(sub)
    return result
""", """
    return [item for sub in {a} for item in sub]
"""), tests=(("{f}([[1, 2], [3], []])", "[1, 2, 3]"),)),
    dict(names=("chunk", "chunks", "split_into_chunks"), params=(("items: list", "size: int"), ("values: list", "n: int")),
         ret="list[list]", docs=("Split {a} into lists of at most the given size.", "Yield successive chunks of {a}."),
         bodies=("""
    return [{a}[i:i + {b}] for i in range(0, len({a}), {b})]
""",), tests=(("{f}([1, 2, 3, 4, 5], 2)", "[[1, 2], [3, 4], [5]]"),)),
    dict(names=("find_max", "maximum", "largest"), params=(("numbers: list[int]",), ("values: list[int]",)), ret="int",
         docs=("Return the largest number in {a}.", "Find the maximum of a non-empty list."),
         bodies=("""
    best = {a}[0]
    for value in {a}[1:]:
        if value > best:
            best = value
    return best
""", """
    return max({a})
"""), tests=(("{f}([3, 9, 2])", "9"), ("{f}([-1, -5])", "-1"))),
    dict(names=("find_min", "minimum", "smallest"), params=(("numbers: list[int]",), ("values: list[int]",)), ret="int",
         docs=("Return the smallest number in {a}.", "Find the minimum of a non-empty list."),
         bodies=("""
    best = {a}[0]
    for value in {a}[1:]:
        if value < best:
            best = value
    return best
""",), tests=(("{f}([3, 9, 2])", "2"),)),
    dict(names=("average", "mean", "compute_average"), params=(("numbers: list[float]",), ("values: list[float]",)),
         ret="float", docs=("Return the arithmetic mean of {a}.", "Average of a list of numbers; 0.0 if empty."),
         bodies=("""
    if not {a}:
        return 0.0
    return sum({a}) / len({a})
""", """
    total = 0.0
    for value in {a}:
        total += value
    return total / len({a}) if {a} else 0.0
"""), tests=(("{f}([1, 2, 3, 4])", "2.5"), ("{f}([])", "0.0"))),
    dict(names=("median",), params=(("numbers: list[float]",), ("values: list[float]",)), ret="float",
         docs=("Return the median of {a}.", "Middle value of the sorted numbers."),
         bodies=("""
    ordered = sorted({a})
    mid = len(ordered) // 2
    if len(ordered) % 2:
        return ordered[mid]
    return (ordered[mid - 1] + ordered[mid]) / 2
""",), tests=(("{f}([3, 1, 2])", "2"), ("{f}([1, 2, 3, 4])", "2.5"))),
    dict(names=("sum_of_squares", "square_sum"), params=(("numbers: list[int]",), ("n: int",)), ret="int",
         docs=("Return the sum of the squares of {a}.",),
         bodies=("""
    if isinstance({a}, int):
        return sum(i * i for i in range(1, {a} + 1))
    return sum(x * x for x in {a})
""",), tests=(("{f}([1, 2, 3])", "14"), ("{f}(3)", "14"))),
    dict(names=("sum_even", "sum_of_evens"), params=(("numbers: list[int]",), ("values: list[int]",)), ret="int",
         docs=("Return the sum of the even numbers in {a}.",),
         bodies=("""
    return sum(x for x in {a} if x % 2 == 0)
""", """
    total = 0
    for x in {a}:
        if x % 2 == 0:
            total += x
    return total
"""), tests=(("{f}([1, 2, 3, 4])", "6"),)),
    dict(names=("filter_even", "evens", "only_even"), params=(("numbers: list[int]",), ("values: list[int]",)),
         ret="list[int]", docs=("Return the even numbers of {a}.", "Keep only the even values."),
         bodies=("""
    return [x for x in {a} if x % 2 == 0]
""", """
    result = []
    for x in {a}:
        if x % 2 == 0:
            result.append(x)
    return result
"""), tests=(("{f}([1, 2, 3, 4])", "[2, 4]"),)),
    dict(names=("square_all", "squares"), params=(("numbers: list[int]",), ("values: list[int]",)), ret="list[int]",
         docs=("Return the square of every number in {a}.",),
         bodies=("""
    return [x * x for x in {a}]
""", """
    return list(map(lambda x: x ** 2, {a}))
"""), tests=(("{f}([1, 2, 3])", "[1, 4, 9]"),)),
    dict(names=("binary_search", "bisect_index"), params=(("items: list[int]", "target: int"),
                                                          ("values: list[int]", "key: int")),
         ret="int", docs=("Return the index of the target in the sorted list {a}, or -1.",
                          "Binary search in a sorted list."),
         bodies=("""
    lo, hi = 0, len({a}) - 1
    while lo <= hi:
        mid = (lo + hi) // 2
        if {a}[mid] == {b}:
            return mid
        if {a}[mid] < {b}:
            lo = mid + 1
        else:
            hi = mid - 1
    return -1
""",), tests=(("{f}([1, 3, 5, 7], 5)", "2"), ("{f}([1, 3, 5], 4)", "-1"))),
    dict(names=("bubble_sort", "sort_numbers"), params=(("items: list[int]",), ("values: list[int]",)),
         ret="list[int]", docs=("Sort {a} with bubble sort and return a new list.", "Return a sorted copy of {a}."),
         bodies=("""
    result = list({a})
    n = len(result)
    for i in range(n):
        for j in range(n - i - 1):
            if result[j] > result[j + 1]:
                result[j], result[j + 1] = result[j + 1], result[j]
    return result
""",), tests=(("{f}([3, 1, 2])", "[1, 2, 3]"),)),
    dict(names=("merge_sorted", "merge_lists"), params=(("left: list[int]", "right: list[int]"),), ret="list[int]",
         docs=("Merge two sorted lists into one sorted list.",),
         bodies=("""
    result = []
    i = j = 0
    while i < len({a}) and j < len({b}):
        if {a}[i] <= {b}[j]:
            result.append({a}[i])
            i += 1
        else:
            result.append({b}[j])
            j += 1
    result.extend({a}[i:])
    result.extend({b}[j:])
    return result
""",), tests=(("{f}([1, 4], [2, 3])", "[1, 2, 3, 4]"),)),
    dict(names=("clamp",), params=(("value: float", "low: float", "high: float"),), ret="float",
         docs=("Limit {a} to the range [low, high].",),
         bodies=("""
    return max({b}, min({a}, {c}))
""",), tests=(("{f}(5, 0, 3)", "3"), ("{f}(-1, 0, 3)", "0"))),
    dict(names=("is_leap_year", "leap_year"), params=(("year: int",),), ret="bool",
         docs=("Return True if {a} is a leap year.",),
         bodies=("""
    return {a} % 4 == 0 and ({a} % 100 != 0 or {a} % 400 == 0)
""", """
    if {a} % 400 == 0:
        return True
    if {a} % 100 == 0:
        return False
    return {a} % 4 == 0
"""), tests=(("{f}(2024)", "True"), ("{f}(1900)", "False"))),
    dict(names=("digit_sum", "sum_digits"), params=(("n: int",), ("number: int",)), ret="int",
         docs=("Return the sum of the decimal digits of {a}.",),
         bodies=("""
    return sum(int(d) for d in str(abs({a})))
""", """
    {a} = abs({a})
    total = 0
    while {a}:
        total += {a} % 10
        {a} //= 10
    return total
"""), tests=(("{f}(1234)", "10"),)),
    dict(names=("to_binary", "binary_string"), params=(("n: int",),), ret="str",
         docs=("Return the binary representation of {a} as a string.",),
         bodies=("""
    if {a} == 0:
        return "0"
    digits = []
    while {a} > 0:
        digits.append(str({a} % 2))
        {a} //= 2
    return "".join(reversed(digits))
""", """
    return bin({a})[2:]
"""), tests=(("{f}(5)", "'101'"), ("{f}(0)", "'0'"))),
    dict(names=("char_frequency", "letter_counts"), params=(("text: str",),), ret="dict[str, int]",
         docs=("Return a dict with the count of each character in {a}.",),
         bodies=("""
    counts = {{}}
    for ch in {a}:
        counts[ch] = counts.get(ch, 0) + 1
    return counts
""",), tests=(("{f}('aab')", "{'a': 2, 'b': 1}"),)),
    dict(names=("is_anagram", "are_anagrams"), params=(("first: str", "second: str"), ("a: str", "b: str")),
         ret="bool", docs=("Return True if the two strings are anagrams of each other.",),
         bodies=("""
    return sorted({a}.replace(" ", "").lower()) == sorted({b}.replace(" ", "").lower())
""",), tests=(("{f}('listen', 'silent')", "True"), ("{f}('abc', 'abd')", "False"))),
    dict(names=("read_lines", "load_lines"), params=(("path: str",), ("filename: str",)), ret="list[str]",
         docs=("Return the lines of the file at {a}, without newlines.", "Read a text file into a list of lines."),
         bodies=("""
    with open({a}, encoding="utf-8") as handle:
        return [line.rstrip("\\n") for line in handle]
""", """
    with open({a}) as f:
        return f.read().splitlines()
"""), tests=(("{f}(os.devnull)", "[]"),)),
    dict(names=("write_lines", "save_lines"), params=(("path: str", "lines: list[str]"),), ret="None",
         docs=("Write {a} with one line per item.",),
         bodies=("""
    with open({a}, "w", encoding="utf-8") as handle:
        for line in {b}:
            handle.write(line + "\\n")
""",), tests=(("{f}(os.devnull, ['a'])", "None"),)),
    dict(names=("load_json", "read_json"), params=(("path: str",),), ret="dict",
         docs=("Load and return the JSON document stored at {a}.",),
         bodies=("""
    import json

    with open({a}, encoding="utf-8") as handle:
        return json.load(handle)
""",), tests=(("callable({f})", "True"),)),
    dict(names=("list_python_files", "find_python_files"), params=(("folder: str",), ("root: str",)),
         ret="list[str]", docs=("Return the paths of the .py files under {a}.",),
         bodies=("""
    import os

    found = []
    for dirpath, _dirnames, filenames in os.walk({a}):
        for name in filenames:
            if name.endswith(".py"):
                found.append(os.path.join(dirpath, name))
    return sorted(found)
""",), tests=(("isinstance({f}('.'), list)", "True"),)),
    dict(names=("safe_divide", "divide"), params=(("a: float", "b: float"), ("numerator: float", "denominator: float")),
         ret="float", docs=("Divide two numbers, returning 0.0 when the divisor is zero.",),
         bodies=("""
    if {b} == 0:
        return 0.0
    return {a} / {b}
""", """
    try:
        return {a} / {b}
    except ZeroDivisionError:
        return 0.0
"""), tests=(("{f}(6, 3)", "2.0"), ("{f}(1, 0)", "0.0"))),
    dict(names=("parse_int", "to_int"), params=(("text: str", "default: int = 0"),), ret="int",
         docs=("Parse {a} as an integer, or return the default.",),
         bodies=("""
    try:
        return int({a})
    except ValueError:
        return {b}
""",), tests=(("{f}('42')", "42"), ("{f}('x')", "0"))),
    dict(names=("slugify", "make_slug"), params=(("title: str",), ("text: str",)), ret="str",
         docs=("Turn {a} into a lowercase, dash-separated slug.",),
         bodies=("""
    import re

    words = re.findall(r"[a-z0-9]+", {a}.lower())
    return "-".join(words)
""",), tests=(("{f}('Hello, World!')", "'hello-world'"),)),
    dict(names=("pairwise_sums", "adjacent_sums"), params=(("numbers: list[int]",),), ret="list[int]",
         docs=("Return the sums of neighbouring elements of {a}.",),
         bodies=("""
    return [x + y for x, y in zip({a}, {a}[1:])]
""",), tests=(("{f}([1, 2, 3])", "[3, 5]"),)),
    dict(names=("running_total", "cumulative_sum"), params=(("numbers: list[int]",), ("values: list[int]",)),
         ret="list[int]", docs=("Return the running totals of {a}.",),
         bodies=("""
    totals = []
    total = 0
    for x in {a}:
        total += x
        totals.append(total)
    return totals
""",), tests=(("{f}([1, 2, 3])", "[1, 3, 6]"),)),
    dict(names=("most_common", "top_item"), params=(("items: list",),), ret="object",
         docs=("Return the most frequent element of {a}.",),
         bodies=("""
    from collections import Counter

    return Counter({a}).most_common(1)[0][0]
""", """
    counts = {{}}
    for item in {a}:
        counts[item] = counts.get(item, 0) + 1
    return max(counts, key=counts.get)
"""), tests=(("{f}([1, 2, 2, 3])", "2"),)),
    dict(names=("invert_dict", "reverse_mapping"), params=(("mapping: dict",), ("d: dict",)), ret="dict",
         docs=("Return a dict with the keys and values of {a} swapped.",),
         bodies=("""
    return {{value: key for key, value in {a}.items()}}
""",), tests=(("{f}({{'a': 1}})", "{1: 'a'}"),)),
    dict(names=("merge_dicts", "combine"), params=(("first: dict", "second: dict"),), ret="dict",
         docs=("Return a new dict with the entries of both; the second wins on conflicts.",),
         bodies=("""
    result = dict({a})
    result.update({b})
    return result
""",), tests=(("{f}({{'a': 1}}, {{'b': 2}})", "{'a': 1, 'b': 2}"),)),
    dict(names=("distance", "euclidean_distance"), params=(("p: tuple[float, float]", "q: tuple[float, float]"),),
         ret="float", docs=("Return the Euclidean distance between two points.",),
         bodies=("""
    import math

    return math.hypot({b}[0] - {a}[0], {b}[1] - {a}[1])
""",), tests=(("{f}((0, 0), (3, 4))", "5.0"),)),
    dict(names=("truncate", "shorten"), params=(("text: str", "width: int = 20"),), ret="str",
         docs=("Shorten {a} to at most width characters, ending in '...'.",),
         bodies=("""
    if len({a}) <= {b}:
        return {a}
    return {a}[: {b} - 3] + "..."
""",), tests=(("{f}('short')", "'short'"),)),
]

CLASSES: list[dict] = [
    dict(names=("Stack", "LifoStack"), docs=("A simple last-in, first-out stack.", "Stack of items."), source="""
class {C}:
    def __init__(self) -> None:
        self._items = []

    def push(self, item) -> None:
        self._items.append(item)

    def pop(self):
        if not self._items:
            raise IndexError("pop from an empty stack")
        return self._items.pop()

    def peek(self):
        return self._items[-1]

    def __len__(self) -> int:
        return len(self._items)
"""),
    dict(names=("Queue", "FifoQueue"), docs=("A first-in, first-out queue.",), source="""
class {C}:
    def __init__(self) -> None:
        self._items = []

    def enqueue(self, item) -> None:
        self._items.append(item)

    def dequeue(self):
        if not self._items:
            raise IndexError("dequeue from an empty queue")
        return self._items.pop(0)

    def is_empty(self) -> bool:
        return not self._items
"""),
    dict(names=("BankAccount", "Account"), docs=("A bank account with a balance.",), source="""
class {C}:
    def __init__(self, owner: str, balance: float = 0) -> None:
        self.owner = owner
        self.balance = balance

    def deposit(self, amount: float) -> None:
        if amount <= 0:
            raise ValueError("amount must be positive")
        self.balance += amount

    def withdraw(self, amount: float) -> None:
        if amount > self.balance:
            raise ValueError("insufficient funds")
        self.balance -= amount

    def __repr__(self) -> str:
        return f"{C}({self.owner!r}, {self.balance})"
"""),
    dict(names=("Point", "Vector2"), docs=("A point in the plane.",), source="""
class {C}:
    def __init__(self, x: float, y: float) -> None:
        self.x = x
        self.y = y

    def __add__(self, other: "{C}") -> "{C}":
        return {C}(self.x + other.x, self.y + other.y)

    def distance_to(self, other: "{C}") -> float:
        return ((self.x - other.x) ** 2 + (self.y - other.y) ** 2) ** 0.5

    def __repr__(self) -> str:
        return f"{C}({self.x}, {self.y})"
"""),
    dict(names=("Rectangle", "Rect"), docs=("An axis-aligned rectangle.",), source="""
class {C}:
    def __init__(self, width: float, height: float) -> None:
        self.width = width
        self.height = height

    def area(self) -> float:
        return self.width * self.height

    def perimeter(self) -> float:
        return 2 * (self.width + self.height)

    def is_square(self) -> bool:
        return self.width == self.height
"""),
    dict(names=("Counter", "TallyCounter"), docs=("Counts how often each key was added.",), source="""
class {C}:
    def __init__(self) -> None:
        self.counts = {}

    def add(self, key) -> None:
        self.counts[key] = self.counts.get(key, 0) + 1

    def get(self, key) -> int:
        return self.counts.get(key, 0)

    def most_common(self):
        return max(self.counts, key=self.counts.get)
"""),
    dict(names=("Inventory", "Store"), docs=("Items in stock and their quantities.",), source="""
class {C}:
    def __init__(self) -> None:
        self.items = {}

    def add_item(self, name: str, quantity: int = 1) -> None:
        self.items[name] = self.items.get(name, 0) + quantity

    def remove_item(self, name: str, quantity: int = 1) -> None:
        if self.items.get(name, 0) < quantity:
            raise ValueError(f"not enough {name}")
        self.items[name] -= quantity

    def total(self) -> int:
        return sum(self.items.values())
"""),
    dict(names=("Timer", "Stopwatch"), docs=("Measures elapsed wall-clock time.",), source="""
class {C}:
    def __init__(self) -> None:
        self.start = None
        self.elapsed = 0.0

    def __enter__(self) -> "{C}":
        import time

        self.start = time.perf_counter()
        return self

    def __exit__(self, *exc) -> None:
        import time

        self.elapsed = time.perf_counter() - self.start
"""),
]

