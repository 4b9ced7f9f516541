"""The one use of the `parameterized` package that the vendored tests make, `@parameterized.expand(cases)` on a
unittest method, without that package (not a dependency of this project): one method per case, named as
`parameterized` names them (``<name>_<index>_<first argument>``), the original removed from collection."""

import functools
import inspect
import re


class parameterized:  # noqa: N801 - the name the vendored code uses
    @staticmethod
    def expand(cases):
        def decorator(function):
            namespace = inspect.currentframe().f_back.f_locals  # the class body being defined
            for index, case in enumerate(cases):
                suffix = re.sub(r"\W+", "_", str(case[0])).strip("_")
                name = f"{function.__name__}_{index}_{suffix}"

                def method(self, _case=case):
                    return function(self, *_case)

                namespace[name] = functools.wraps(function)(method)
                namespace[name].__name__ = name
            function.__test__ = False
            return function

        return decorator
